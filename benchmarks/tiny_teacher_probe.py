"""Where are the tiny teacher's tokens right? On the student's own rollouts (student prompt, the
training rollouts' sampling), at each step's result (``a op x = ?``): the value that follows from
the line's left side, the student's greedy value there and the privileged teacher's. A line is on
the solution's path when its left side equals the solution's line (every earlier result was
right); off it, a teacher that copies the quoted solution teaches a number that does not follow
from the line (``copies``).

    python benchmarks/tiny_teacher_probe.py tiny/results/models/tiny_qwen3/base [--problems 150]

Prints one line: the student's and the teacher's greedy accuracy on and off the path, how often the
teacher copies the solution's number off it, and the mean probability each gives the right value's
first token there (``p_``: sampling meets a slip rate that greedy decoding hides). On the committed
build (seed 0): on the path, greedy student 0.98 and teacher 1.00, probability 0.65 and 0.94 (the
student slips, the copying teacher does not); off it (a fifth of the results) the teacher copies the
solution's number 43% of the time and is right 27% (probability of the right value 0.26, the
student's 0.48). On the builds of the recipe before the fact examples on which the method failed
(seeds 0 and 4 at step 800), off the path the teacher copied 87% and 78% of the time
(docs/tiny_robustness.md).
``--max-value 0`` probes a build of the older recipe (unbounded chains, no slips): on its builds 0
and 1 the teacher was right at 78-80% of on-path results, the student at 45-55% (greedy: missing
facts), and it copied off the path 69-73% of the time (docs/tiny_robustness.md).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

LINE = re.compile(r"^(-?\d+) ([+-]) (\d+) = (-?\d+)$")


def greedy_line_end(model, tok, prefix: str, right: str) -> tuple[str, float]:
    """The model's greedy continuation of ``prefix`` up to the end of the line, and the probability
    it gives the first token of the right value there (where greedy decoding hides a slip rate,
    sampling meets it): one generate call, its first step's raw logits."""
    import torch

    ids = tok(prefix, add_special_tokens=False, return_tensors="pt").input_ids
    first = tok(right, add_special_tokens=False).input_ids[0]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=4, do_sample=False, output_logits=True, return_dict_in_generate=True)
    text = tok.decode(out.sequences[0, ids.shape[1]:]).split("\n")[0].strip()
    return text, float(torch.softmax(out.logits[0][0].double(), -1)[first])


def probe(model_dir: Path, problems: int, seed: int = 0, max_value: int | None = 9) -> dict[str, tuple[float, int]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pwopsd import prompts
    from pwopsd.tiny.arithmetic import sample_problems

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    counts = {k: [0, 0] for k in ("student_on", "teacher_on", "student_off", "teacher_off", "teacher_off_copies",
                                  "p_student_on", "p_teacher_on", "p_student_off", "p_teacher_off")}
    torch.manual_seed(seed)
    for p in sample_problems(7, problems, [1, 2, 3], 9, max_value):  # the tiny training corpus' generator
        student = prompts.render(tok, prompts.student_message(p.problem), prompts.STUDENT)
        teacher = prompts.render(tok, prompts.teacher_message(p.problem, p.reference_solution("worked")), prompts.TEACHER)
        ids = tok(student, add_special_tokens=False, return_tensors="pt").input_ids
        with torch.no_grad():  # the training rollouts' sampling (tiny config: T 1.0, top-k 20, top-p 0.95)
            out = model.generate(ids, max_new_tokens=64, do_sample=True, temperature=1.0, top_k=20, top_p=0.95)
        lines, solution, done = tok.decode(out[0, ids.shape[1]:]).split("\n"), p.steps(), ""
        for k, line in enumerate(lines):
            m = LINE.match(line)
            if not m:
                break
            a, op, x = int(m[1]), m[2], int(m[3])
            head = f"{a} {op} {x} = "
            right = str(a + x if op == "+" else a - x)
            where = "on" if k < len(solution) and solution[k].startswith(head) else "off"
            for who, prompt in (("student", student), ("teacher", teacher)):
                value, probability = greedy_line_end(model, tok, prompt + done + head, right)
                counts[f"{who}_{where}"][0] += value == right
                counts[f"{who}_{where}"][1] += 1
                counts[f"p_{who}_{where}"][0] += probability
                counts[f"p_{who}_{where}"][1] += 1
                if who == "teacher" and where == "off" and k < len(solution):
                    counts["teacher_off_copies"][0] += value == solution[k].split("= ")[1]
                    counts["teacher_off_copies"][1] += 1
            done += line + "\n"
    return {k: (a, b) for k, (a, b) in counts.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path, help="a tiny model folder (results/models/tiny_qwen3/base)")
    ap.add_argument("--problems", type=int, default=150)
    ap.add_argument("--max-value", type=int, default=9,
                    help="the corpus' tiny source max_value (0: unbounded, the recipe before the slips)")
    args = ap.parse_args(argv)
    counts = probe(args.model, args.problems, max_value=args.max_value or None)
    print(f"{args.model}: " + ", ".join(f"{k} {a:.0f}/{b} = {a / max(b, 1):.2f}" if not k.startswith("p_")
                                        else f"{k} {a / max(b, 1):.2f}" for k, (a, b) in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
