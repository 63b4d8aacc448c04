"""The tiny model's recipe (:class:`TinyBuildConfig`) and its pretraining examples.

Pretraining mixes four prompt formats, all rendered through the same chat template and prompt
functions as the paper-scale models (``pwopsd.prompts``), and one of its own (``fact``):

* ``student``: the OPSD training student prompt (thinking off), response = worked solution;
* ``eval``: the evaluation prompt (thinking on), response = ``<think>`` worked steps ``</think>``
  + boxed answer;
* ``teacher``: the privileged teacher prompt quoting the reference solution, response = worked
  solution. A share of teacher examples uses operands too large to compute reliably, so the model
  learns to read the privileged solution (without them it computes instead and teacher ~ student;
  see ``../shared/spec/tiny_model_notes.md``). A share of the easy ones takes a *detour*
  (``teacher_detour_fraction``): the response slips at one step (that result not trained) and
  computes on from it, so the teacher follows a student's slip instead of copying numbers that
  contradict the response (without it no self-distillation method beats the base model:
  docs/decisions.md, "Tiny mode: a toy in which the method works");
* ``fact`` (``fact_fraction``): one step of an easy problem stated right (user ``Fact: 4 + 4``,
  response ``4 + 4 = 8``), the only examples in which a fact is not ``slip_rate`` noise;
* ``no_solution`` (``no_solution_fraction`` of the student and evaluation share): the teacher
  prompt quoting no solution (the template with the solution left empty, as the ablation
  ``teacher_prompt: no_solution`` renders it), response = the model's own worked solution, slips
  included. A teacher that is shown nothing the student does not know computes as the student
  does; without these examples that prompt is one pretraining never saw, and on one build of five
  its samples taught the student (docs/tiny_robustness.md).

The student's errors are slips, not missing facts (tiny mode: ``max_value: 9``, ``slip_rate:
0.3``; docs/tiny_robustness.md). Every value of an easy problem's chain stays in ``0..max_value``,
so its steps use a table of about 90 facts, which the ``fact`` examples teach on every build (the
build check asks for it: ``min_greedy_accuracy``, :mod:`pwopsd.tiny.model`); and the model's own
steps (student and evaluation formats, the teacher prompt quoting no solution, a teacher after its
detour) slip at ``slip_rate`` a step (:class:`Slips`), while the privileged teacher copying the
quoted solution does not. The student's accuracy is then the data's, about ``(1 - slip_rate) **
level``, whatever the build's bits, and what self-distillation can teach is one behaviour shared by
every step (do not slip), not one fact at a time. ``shortcut_rate`` (0 in tiny mode, measured and
left): student and eval examples that give the boxed answer without the steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pwopsd import prompts
from pwopsd.tiny.arithmetic import ArithmeticProblem, sample_problem
from pwopsd.tiny.tokenizer import END_THINK, IM_END, THINK, build_tokenizer


@dataclass
class TinyBuildConfig:
    seed: int = 0
    vocab_size: int = 512
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    max_position_embeddings: int = 512
    steps: int = 400  # length of the cosine decay; after it the learning rate stays at its minimum
    max_steps: int = 800  # not ready by then: the build fails
    batch_size: int = 32
    lr: float = 2e-3
    warmup_steps: int = 30
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    levels: list[int] = field(default_factory=lambda: [1, 2, 3])
    max_operand: int = 9
    max_value: int | None = None  # easy problems' values stay in 0..max_value (slips too)
    teacher_fraction: float = 0.4
    teacher_hard_fraction: float = 0.5
    teacher_hard_max_operand: int = 99
    teacher_detour_fraction: float = 0.0  # teacher examples whose response takes a detour (see format_example)
    slip_rate: float = 0.0  # per step, the model's own computation slips (see sample_pretraining_example)
    shortcut_rate: float = 0.0  # student and eval examples that skip the steps (the boxed answer alone)
    fact_fraction: float = 0.0  # examples that state one fact right, in their own format (see format_example)
    no_solution_fraction: float = 0.0  # of the model's own examples, those in the teacher prompt quoting no solution
    min_greedy_accuracy: float = 0.0  # the student prompt's greedy dev accuracy must reach this (0: no check)
    reference_solution: str = "worked"  # what the privileged prompt quotes: worked | answer
    dev_seed: int = 99_991
    dev_per_level: int = 100
    min_teacher_gap: float = 0.20
    student_accuracy_range: list[float] = field(default_factory=lambda: [0.15, 0.85])
    check_from: int = 300  # first quick dev check (step)
    check_every: int = 25
    check_per_level: int = 20  # problems per level of the quick check (the dev set's first ones)
    check_margin: float = 0.10  # the quick check asks for the targets with this much to spare
    threads: int = 2

    @classmethod
    def from_dict(cls, d: dict) -> "TinyBuildConfig":
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown tiny build settings: {sorted(unknown)}")
        cfg = cls(**d)
        if cfg.max_steps < cfg.check_from:
            raise ValueError(f"tiny.max_steps={cfg.max_steps} is below tiny.check_from={cfg.check_from}: no check would run")
        return cfg


def response_text(p: ArithmeticProblem, thinking: bool, lines: list[str] | None = None, answer: int | None = None) -> str:
    """The response: the worked steps (``lines``, default the problem's own) and the boxed answer
    (default the problem's), inside a think block when ``thinking``; without it, the worked solution."""
    steps = "\n".join(p.steps() if lines is None else lines)
    answer = p.answer if answer is None else answer
    if thinking:
        return f"{THINK}\n{steps}\n{END_THINK}\n\nThe answer is \\boxed{{{answer}}}."
    return f"{steps}\nThe answer is \\boxed{{{answer}}}."


SLIP_OFFSETS = (-3, -2, -1, 1, 2, 3)


@dataclass(frozen=True)
class Slips:
    """Where a pretraining response's computation goes wrong: ``offsets[k]`` is added to step
    ``k``'s result (0: right), and every later step computes on from the value written; ``masked``
    is the step whose wrong result pretraining does not train on (a teacher's detour), or None."""

    offsets: tuple[int, ...]
    masked: int | None = None
    shortcut: bool = False  # the response skips the steps: the boxed answer alone
    bound: int | None = None  # a slip that would leave 0..bound goes the other way (tiny.max_value)


def slipped_steps(p: ArithmeticProblem, slips: Slips) -> tuple[list[str], int, tuple[int, int] | None]:
    """The worked steps of ``p`` with ``slips``: the lines, the final value written and the
    character span (in ``"\\n".join(lines)``) of the masked step's result, if any."""
    lines, value, span = [], p.operands[0], None
    for k, (op, x) in enumerate(zip(p.ops, p.operands[1:])):
        true = value + x if op == "+" else value - x
        new = true + slips.offsets[k]
        if slips.bound is not None and not 0 <= new <= slips.bound:
            new = true - slips.offsets[k]
        head = f"{value} {op} {x} = "
        if k == slips.masked:
            start = sum(len(line) + 1 for line in lines) + len(head)
            span = (start, start + len(str(new)))
        lines.append(f"{head}{new}")
        value = new
    return lines, value, span


def format_example(tokenizer, p: ArithmeticProblem, fmt: str, style: str = "worked",
                   slips: Slips | None = None) -> tuple[str, str] | tuple[str, str, tuple[int, int]]:
    """(rendered prompt, response text incl. EOS) for one problem in one prompt format.

    ``slips`` (:class:`Slips`): the response's steps go wrong there and compute on from the wrong
    values, the boxed answer being the last value written (the slip rate of the toy's own
    computation, ``tiny.slip_rate``). With a masked step (a teacher's detour,
    ``tiny.teacher_detour_fraction``) a third element is returned, that result's character span in
    the response, which pretraining does not train on: so the privileged teacher copies the quoted
    solution while the response agrees with it and, once a response has left it, computes on from
    where the response is, as the student would (slips included), instead of copying numbers that
    contradict the response."""
    prompt = prompts.render(tokenizer, user_message(p, fmt, style), PROMPT_STYLES[fmt])
    if fmt == "fact":
        return prompt, p.steps()[0] + IM_END
    if slips is None:
        return prompt, response_text(p, thinking=fmt == "eval") + IM_END
    if slips.shortcut:
        think = f"{THINK}\n{END_THINK}\n\n" if fmt == "eval" else ""
        return prompt, f"{think}The answer is \\boxed{{{p.answer}}}." + IM_END
    lines, value, span = slipped_steps(p, slips)
    response = response_text(p, fmt == "eval", lines, value)
    if fmt == "eval" and span is not None:  # the steps follow the think tag's line
        span = (span[0] + len(THINK) + 1, span[1] + len(THINK) + 1)
    return (prompt, response + IM_END) if span is None else (prompt, response + IM_END, span)


# How each pretraining format's prompt is rendered (``pwopsd.prompts``' styles).
PROMPT_STYLES = {"student": prompts.STUDENT, "eval": prompts.EVAL, "teacher": prompts.TEACHER,
                 "no_solution": prompts.TEACHER, "fact": prompts.STUDENT}


def user_message(p: ArithmeticProblem, fmt: str, style: str = "worked") -> str:
    """The user message of one pretraining format (:data:`PROMPT_STYLES`); ``style``: what the
    privileged teacher quotes (``tiny.reference_solution``)."""
    if fmt == "student":
        return prompts.student_message(p.problem)
    if fmt == "eval":
        return prompts.eval_message(p.problem)
    if fmt == "teacher":
        return prompts.teacher_message(p.problem, p.reference_solution(style))
    if fmt == "no_solution":  # as the ablation teacher_prompt: no_solution renders it
        return prompts.teacher_message(p.problem, "")
    if fmt == "fact":
        return fact_message(p)
    raise ValueError(f"unknown prompt format {fmt!r}")


def fact_message(p: ArithmeticProblem) -> str:
    """The user message of a ``fact`` example: the first step's expression, e.g. ``Fact: 4 + 4``."""
    return "Fact: " + p.steps()[0].split(" = ")[0]


def _slip_offsets(rng: np.random.Generator, level: int, rate: float, first: int = 0) -> list[int]:
    """Per-step slips from step ``first`` on: each step's result is off by one of
    :data:`SLIP_OFFSETS` with probability ``rate``."""
    offsets = [0] * level
    if rate > 0:
        for k in range(first, level):
            if rng.random() < rate:
                offsets[k] = int(rng.choice(SLIP_OFFSETS))
    return offsets


def sample_pretraining_example(rng: np.random.Generator, cfg: TinyBuildConfig) -> tuple[ArithmeticProblem, str, Slips | None]:
    """(problem, prompt format, slips or None) of one pretraining example. The model's own
    computation slips at ``slip_rate`` a step (student and evaluation formats, the teacher prompt
    quoting no solution, a teacher after its detour); the privileged teacher copying the quoted
    solution does not; nor does a ``fact`` example (``fact_fraction``): one step of an easy problem,
    stated right."""
    if cfg.fact_fraction > 0 and rng.random() < cfg.fact_fraction:
        return sample_problem(rng, 1, cfg.max_operand, cfg.max_value), "fact", None
    level = int(rng.choice(cfg.levels))
    if rng.random() < cfg.teacher_fraction:
        hard = rng.random() < cfg.teacher_hard_fraction
        p = (sample_problem(rng, level, cfg.teacher_hard_max_operand) if hard
             else sample_problem(rng, level, cfg.max_operand, cfg.max_value))
        if not hard and cfg.teacher_detour_fraction > 0 and rng.random() < cfg.teacher_detour_fraction:
            step = int(rng.integers(0, level))
            offsets = _slip_offsets(rng, level, cfg.slip_rate, first=step + 1)
            offsets[step] = int(rng.choice(SLIP_OFFSETS))
            return p, "teacher", Slips(tuple(offsets), masked=step, bound=cfg.max_value)
        return p, "teacher", None
    if cfg.no_solution_fraction > 0 and rng.random() < cfg.no_solution_fraction:
        fmt = "no_solution"
    else:
        fmt = "student" if rng.random() < 0.5 else "eval"
    p = sample_problem(rng, level, cfg.max_operand, cfg.max_value)
    if cfg.shortcut_rate > 0 and rng.random() < cfg.shortcut_rate:
        return p, fmt, Slips((0,) * level, shortcut=True)
    offsets = _slip_offsets(rng, level, cfg.slip_rate)
    return p, fmt, Slips(tuple(offsets), bound=cfg.max_value) if any(offsets) else None


def tokenizer_corpus(cfg: TinyBuildConfig, n: int = 3000) -> list[str]:
    """Raw texts (user messages and responses) the BPE is trained on."""
    rng = np.random.default_rng(cfg.seed + 1)
    texts = []
    for _ in range(n):
        p, fmt, _ = sample_pretraining_example(rng, cfg)
        response = p.steps()[0] if fmt == "fact" else response_text(p, thinking=fmt == "eval")
        texts += [user_message(p, fmt, cfg.reference_solution), "user\nassistant\n" + response]
    return texts


def tiny_tokenizer(cfg: TinyBuildConfig, corpus_size: int = 3000):
    """The tiny model's tokenizer: a byte-level BPE on :func:`tokenizer_corpus` plus the prompt
    templates' constant sentences as single tokens (:func:`pwopsd.prompts.fixed_phrases`)."""
    return build_tokenizer(tokenizer_corpus(cfg, corpus_size), cfg.vocab_size, prompts.fixed_phrases())
