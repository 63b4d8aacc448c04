"""Is the privileged teacher a better policy than the student? (issue 53)

Samples SmolLM2-135M-Instruct (the learning run's model, in the host's rehearsal dtype) from three
prompts of the same training problems (``config/learning.yaml``'s corpus): the student's, the
paper's privileged teacher template (the reference solution, then the transition paragraph "After
reading the reference solution above ... explore different approaches ..."), and the same template
without that paragraph (``training.teacher_transition: false``). Prints, per prompt, how often a
sample boxes an answer and how often that answer is right. Self-distillation moves the student
toward the teacher's distribution over the student's own rollouts; a teacher prompt the model
answers worse from than from the student's own has nothing good to give.

    python benchmarks/real_model_teacher_prompts.py [--cache /tmp/smol-cache] [--problems 24] [--samples 4]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, default=Path("/tmp/smol-cache"), help="the model's offline Hub cache (built if missing)")
    ap.add_argument("--problems", type=int, default=24)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=None,
                    help="default: the overlay's training.temperature; 0: greedy (what the model's mode answers)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="settings over the overlay (as real_model_learning.py)")
    args = ap.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pwopsd import prompts
    from pwopsd.config import load_config_files, validate_config
    from pwopsd.config.files import merge_configs
    from pwopsd.config.overrides import dotted_overrides
    from pwopsd.data import load_tiny
    from pwopsd.evaluation.grading import extract_boxed
    from pwopsd.rehearsal import build_snapshot, rehearsal_dtype

    cfg = load_config_files([REPO / "config" / n for n in ("config.yaml", "rehearsal.yaml", "learning.yaml")])
    try:
        cfg = validate_config(merge_configs(cfg, dotted_overrides(args.set, cfg)))  # an unknown key is named
    except ValueError as exc:
        raise SystemExit(f"--set {exc}") from None
    rows, _ = load_tiny(cfg["train_corpus"]["source"])
    rows = rows.iloc[: args.problems]
    temperature = cfg["training"]["temperature"] if args.temperature is None else args.temperature
    samples = args.samples if temperature > 0 else 1  # greedy: one answer a prompt
    snapshot = build_snapshot(args.cache)
    torch.set_num_threads(args.threads)
    dtype = rehearsal_dtype()
    tok = AutoTokenizer.from_pretrained(snapshot["path"])
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(snapshot["path"], dtype=getattr(torch, dtype)).eval()
    variants = {
        "student": lambda r: (prompts.student_message(r.problem), prompts.STUDENT),
        "teacher, the paper's template": lambda r: (prompts.teacher_message(r.problem, r.solution), prompts.TEACHER),
        "teacher, no transition paragraph": lambda r: (prompts.teacher_message(r.problem, r.solution, transition=False),
                                                       prompts.TEACHER),
    }
    decoding = (f"temperature {temperature}, top_p {cfg['training']['rollout_top_p']}, top_k {cfg['training']['rollout_top_k']}"
                if temperature > 0 else "greedy")
    print(f"SmolLM2-135M-Instruct, {dtype}, {len(rows)} training problems x {samples} samples, {decoding}, "
          f"{cfg['training']['max_completion_length']} new tokens")
    print("| prompt | boxes an answer | boxes the right answer | seconds |\n|---|---|---|---|")
    for name, message in variants.items():
        torch.manual_seed(0)
        t0 = time.time()
        texts = [prompts.render(tok, *message(r)) for r in rows.itertuples()]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            sampling = (dict(do_sample=True, temperature=temperature, top_p=cfg["training"]["rollout_top_p"],
                             top_k=cfg["training"]["rollout_top_k"]) if temperature > 0 else dict(do_sample=False, top_p=None, top_k=None))
            out = model.generate(**enc, **sampling, max_new_tokens=cfg["training"]["max_completion_length"],
                                 num_return_sequences=samples, pad_token_id=tok.pad_token_id)
        completions = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        answers = [rows.iloc[i // samples].answer for i in range(len(completions))]
        boxed = [extract_boxed(c) for c in completions]  # the last boxed answer, as the evaluation reads it
        n = len(completions)
        print(f"| {name} | {sum(b is not None for b in boxed) / n:.0%} | {sum(b is not None and b.strip() == a for b, a in zip(boxed, answers)) / n:.0%} "
              f"| {time.time() - t0:.0f} |", flush=True)


if __name__ == "__main__":
    main()
