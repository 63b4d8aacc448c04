"""The tiny model's pretraining data (pwopsd.tiny.examples): slips, teacher detours, shortcuts, and
which tokens pretraining trains on; the teacher prompt ablations of training."""

import numpy as np
import pytest

from pwopsd import prompts
from pwopsd.tiny.arithmetic import ArithmeticProblem, sample_problem, sample_problems
from pwopsd.tiny.examples import (Slips, TinyBuildConfig, format_example, sample_pretraining_example, slipped_steps,
                                  tiny_tokenizer)
from pwopsd.tiny.model import collate
from pwopsd.tiny.tokenizer import THINK

P = ArithmeticProblem((7, 3, 12), ("-", "+"))


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer(TinyBuildConfig(), corpus_size=300)


def test_a_slip_carries_on_and_its_span_is_the_wrong_result():
    lines, value, span = slipped_steps(P, Slips((2, 0), masked=0))
    assert lines == ["7 - 3 = 6", "6 + 12 = 18"] and value == 18  # 7 - 3 = 4, off by 2, then computed on
    assert "\n".join(lines)[span[0]:span[1]] == "6"
    lines, value, span = slipped_steps(P, Slips((0, -3)))
    assert lines == ["7 - 3 = 4", "4 + 12 = 13"] and value == 13 and span is None
    assert slipped_steps(P, Slips((0, 0))) == (P.steps(), P.answer, None)


def chain(p: ArithmeticProblem, lines: list[str] | None = None) -> list[int]:
    """The values of a problem's chain: its first operand and each step's result (of ``lines``,
    the worked steps as written, by default the right ones)."""
    return [p.operands[0]] + [int(line.rsplit("= ", 1)[1]) for line in (lines or p.steps())]


def test_bounded_chains_stay_in_their_table_of_facts():
    problems = sample_problems(3, 600, [1, 2, 3, 4], max_operand=9, max_value=9)
    assert all(0 <= v <= 9 for p in problems for v in chain(p))
    assert all(1 <= x <= 9 for p in problems for x in p.operands)
    ops = [op for p in problems for op in p.ops]
    assert 0.4 < ops.count("+") / len(ops) < 0.6  # both operations, about equally often
    assert {p.level for p in problems} == {1, 2, 3, 4}
    # without a bound the stream is the one it always was (benchmarks and corpora keep their problems)
    rng = np.random.default_rng(3)
    assert sample_problems(3, 50, [1, 2, 3], 9) == [sample_problem(rng, [1, 2, 3][i % 3], 9) for i in range(50)]


def test_a_slip_that_would_leave_the_bound_goes_the_other_way():
    p = ArithmeticProblem((6, 2, 3), ("+", "-"))  # 6 + 2 = 8, 8 - 3 = 5
    assert slipped_steps(p, Slips((3, 0), bound=9))[0] == ["6 + 2 = 5", "5 - 3 = 2"]  # 11 is out: 8 - 3
    assert slipped_steps(p, Slips((3, 0)))[0] == ["6 + 2 = 11", "11 - 3 = 8"]
    assert slipped_steps(p, Slips((1, -3), bound=9))[0] == ["6 + 2 = 9", "9 - 3 = 3"]


def test_bounded_pretraining_data_computes_inside_the_bound():
    # no hard teacher examples: their chains are unbounded, and some have only small operands
    cfg = TinyBuildConfig(max_value=9, slip_rate=0.3, teacher_detour_fraction=0.4, teacher_hard_fraction=0.0)
    rng = np.random.default_rng(2)
    draws = [sample_pretraining_example(rng, cfg) for _ in range(3000)]
    easy = [(p, s) for p, f, s in draws]
    assert all(0 <= v <= 9 for p, _ in easy for v in chain(p))
    for p, s in easy:  # a slip of a result inside the bound stays inside it (what follows computes on)
        for k, line in enumerate(slipped_steps(p, s)[0] if s and not s.shortcut else []):
            left, op, x, _, written = line.split()
            true = int(left) + int(x) if op == "+" else int(left) - int(x)
            assert s.offsets[k] == 0 or not 0 <= true <= 9 or 0 <= int(written) <= 9
    slipped = [s for p, f, s in draws if f != "teacher" and s is not None]
    steps = sum(p.level for p, f, _ in draws if f != "teacher")
    assert abs(sum(o != 0 for s in slipped for o in s.offsets) / steps - 0.3) < 0.03  # the slip rate per step


def test_fact_examples_state_one_easy_fact_right_in_their_own_format(tok):
    cfg = TinyBuildConfig(max_value=9, slip_rate=0.3, fact_fraction=0.1, teacher_detour_fraction=0.4)
    rng = np.random.default_rng(5)
    draws = [sample_pretraining_example(rng, cfg) for _ in range(4000)]
    facts = [(p, s) for p, f, s in draws if f == "fact"]
    assert abs(len(facts) / len(draws) - 0.1) < 0.015 and all(s is None for _, s in facts)
    assert all(p.level == 1 and 0 <= p.answer <= 9 for p, _ in facts)
    p = ArithmeticProblem((4, 4), ("+",))
    prompt, response = format_example(tok, p, "fact")
    assert "Fact: 4 + 4<|im_end|>" in prompt and "Problem:" not in prompt and response == "4 + 4 = 8<|im_end|>"
    # the student format's slip rate per step is untouched by the fact share
    steps = sum(p.level for p, f, _ in draws if f in ("student", "eval"))
    slips = sum(o != 0 for p, f, s in draws if f in ("student", "eval") and s is not None for o in s.offsets)
    assert abs(slips / steps - 0.3) < 0.03


def test_no_solution_examples_are_the_ablations_teacher_prompt_computing_as_the_student(tok):
    from pwopsd.training.inputs import Example, teacher_message_for

    cfg = TinyBuildConfig(max_value=9, slip_rate=0.3, fact_fraction=0.1, no_solution_fraction=0.1,
                          teacher_detour_fraction=0.4)
    rng = np.random.default_rng(6)
    draws = [sample_pretraining_example(rng, cfg) for _ in range(6000)]
    own = [(p, f, s) for p, f, s in draws if f in ("student", "eval", "no_solution")]
    blank = [(p, s) for p, f, s in own if f == "no_solution"]
    assert abs(len(blank) / len(own) - 0.1) < 0.015
    assert all(0 <= v <= 9 for p, _ in blank for v in chain(p))  # easy problems, as the student's
    steps = sum(p.level for p, _ in blank)
    slips = sum(o != 0 for _, s in blank if s is not None for o in s.offsets)
    assert abs(slips / steps - 0.3) < 0.04  # it slips as the student does
    # the prompt is the one training's teacher_prompt: no_solution renders; the response the student's
    p = ArithmeticProblem((4, 4), ("+",))
    prompt, response = format_example(tok, p, "no_solution", "worked", Slips((1,), bound=9))
    example = Example(problem=p.problem, solution=p.worked_solution, answer=str(p.answer))
    assert prompt == prompts.render(tok, teacher_message_for(example, "no_solution"), prompts.TEACHER)
    assert p.worked_solution not in prompt and response == format_example(tok, p, "student", "worked", Slips((1,), bound=9))[1]


def test_formats_with_slips_detours_and_shortcuts(tok):
    prompt, response, span = format_example(tok, P, "teacher", "worked", Slips((0, 1), masked=1))
    assert response.startswith("7 - 3 = 4\n4 + 12 = 17\nThe answer is \\boxed{17}.") and response[span[0]:span[1]] == "17"
    assert P.worked_solution in prompt  # the teacher still quotes the right solution
    _, response, span = format_example(tok, P, "eval", "worked", Slips((-1, 0), masked=0))
    assert response.startswith(f"{THINK}\n7 - 3 = 3\n") and response[span[0]:span[1]] == "3"
    assert format_example(tok, P, "eval", "worked", Slips((0, 0))) == format_example(tok, P, "eval", "worked")
    assert format_example(tok, P, "student", "worked", Slips((0, 0), shortcut=True))[1].startswith("The answer is \\boxed{16}.")


def test_pretraining_does_not_train_on_a_detours_slip(tok):
    """Exactly the slipped result's tokens are left out of the labels; every other response token
    is trained, as without a detour."""
    prompt, response, span = format_example(tok, P, "teacher", "worked", Slips((5, 0), masked=0))  # 7 - 3 = 9
    ids, _, labels = collate(tok, [(prompt, response, span), (prompt, response)])
    n_prompt = len(tok(prompt, add_special_tokens=False)["input_ids"])
    skipped = [i - n_prompt for i in range(ids.shape[1]) if labels[0, i] == -100 and labels[1, i] != -100]
    assert len(skipped) == 1 and tok.decode([int(ids[0, n_prompt + skipped[0]])]) == "9"
    assert int((labels[1] != -100).sum()) - int((labels[0] != -100).sum()) == 1


def _old_sample(rng, cfg):
    """The pretraining sampler before slips, detours and shortcuts existed."""
    level = int(rng.choice(cfg.levels))
    if rng.random() < cfg.teacher_fraction:
        hard = rng.random() < cfg.teacher_hard_fraction
        return sample_problem(rng, level, cfg.teacher_hard_max_operand if hard else cfg.max_operand), "teacher"
    fmt = "student" if rng.random() < 0.5 else "eval"
    return sample_problem(rng, level, cfg.max_operand), fmt


def test_without_slips_detours_or_shortcuts_the_data_is_as_before():
    cfg = TinyBuildConfig()
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    for _ in range(300):
        p, fmt, slips = sample_pretraining_example(a, cfg)
        assert (p, fmt) == _old_sample(b, cfg) and slips is None


def test_detours_only_on_easy_teacher_examples_at_their_rate():
    cfg = TinyBuildConfig(teacher_detour_fraction=0.4, shortcut_rate=0.3)
    rng = np.random.default_rng(1)
    draws = [sample_pretraining_example(rng, cfg) for _ in range(4000)]
    teacher = [(p, s) for p, f, s in draws if f == "teacher"]
    easy = [(p, s) for p, s in teacher if max(p.operands) <= cfg.max_operand]
    detours = [s for _, s in easy if s is not None]
    assert all(s.masked is not None and s.offsets[s.masked] != 0 for s in detours)
    assert all(s is None for p, s in teacher if max(p.operands) > cfg.max_operand)
    assert abs(len(detours) / len(easy) - 0.4) < 0.06  # easy ones include hard draws with small operands
    shortcuts = [s for _, f, s in draws if f != "teacher" and s is not None and s.shortcut]
    assert abs(len(shortcuts) / sum(f != "teacher" for _, f, _ in draws) - 0.3) < 0.03


def test_teacher_prompt_ablations():
    from pwopsd.training.loop import Example, teacher_message_for

    e = Example(problem="Compute 7 - 3.", solution="7 - 3 = 4\nThe answer is \\boxed{4}.", answer="4")
    assert teacher_message_for(e, "privileged") == prompts.teacher_message(e.problem, e.solution)
    blank = teacher_message_for(e, "no_solution")
    assert blank == prompts.teacher_message(e.problem, "") and e.solution not in blank and "7 - 3 = 4" not in blank
    with pytest.raises(ValueError, match="teacher_prompt must be one of"):
        teacher_message_for(e, "student")  # the trainer uses the student's own prompt ids for it


def test_a_steps_parts_add_up_to_the_whole_steps_loss_and_gradient(tok):
    """``pretraining_backward`` over parts of a step's rows (one process's half, as
    benchmarks/tiny_build_processes.py splits it) weights each part by its share of the whole
    step's target tokens: the parts' losses and gradients add up to the whole step's (up to
    float32 rounding: another order of sums)."""
    import torch

    from pwopsd.tiny.model import build_model, pretraining_backward

    cfg = TinyBuildConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                          num_key_value_heads=1, head_dim=32, seed=5)
    model = build_model(cfg, tok)
    rng = np.random.default_rng(5)
    batch = [sample_pretraining_example(rng, cfg) for _ in range(12)]
    assert {fmt == "teacher" for _, fmt, _ in batch} == {True, False}  # both length buckets
    whole = pretraining_backward(model, tok, batch, cfg)
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    halves = [pretraining_backward(model, tok, batch, cfg, rows=slice(r, None, 2)) for r in (0, 1)]
    assert sum(halves) == pytest.approx(whole, rel=1e-5)
    for got, ref in zip((p.grad for p in model.parameters()), want):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-6)
