"""Build, pretrain and check the tiny Qwen3 model.

Pretraining mixes three prompt formats, all rendered through the same chat template and prompt
functions as the paper-scale models (``pwopsd.prompts``):

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
  docs/decisions.md, "Tiny mode: a toy in which the method works").

The student's errors are slips, not missing facts (tiny mode: ``max_value: 9``, ``slip_rate:
0.3``; docs/decisions.md, "Tiny mode: a toy robust to its own bits"). Every value of an easy
problem's chain stays in ``0..max_value``, so its steps use a table of about 90 facts, which
pretraining learns by the end of its learning-rate decay on every build; and the model's own steps
(student and evaluation formats, a teacher after its detour) slip at ``slip_rate`` a step
(:class:`Slips`), while the privileged teacher copying the quoted solution does not. The student's
accuracy is then the data's, about ``(1 - slip_rate) ** level``, whatever the build's bits, and what
self-distillation can teach is one behaviour shared by every step (do not slip), not one fact at a
time. ``shortcut_rate`` (0 in tiny mode, measured and left): student and eval examples that give
the boxed answer without the steps.

Pretraining stops when the model is ready: every ``check_every`` steps from ``check_from`` on (tiny
mode: the end of the decay), a quick dev check (the first ``check_per_level`` problems of each
level of the dev set, from a seed disjoint from every benchmark's) asks for the build check's
targets with ``check_margin`` to spare (student and evaluation prompts inside the accuracy range
shrunk by the margin, the privileged teacher ahead by the gap plus the margin); when the quick
check passes, the whole dev set must meet the same targets, margin included, and the model it
accepts passes the build check with that margin to spare. The learning rate warms up, decays by a
cosine over ``steps`` and then stays at its minimum; a model that is not ready by ``max_steps``
fails the build with :class:`TinyModelCheckError`, naming its last check and what to change.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np

from pwopsd import prompts
from pwopsd.tiny.arithmetic import ArithmeticProblem, sample_problem, sample_problems
from pwopsd.tiny.tokenizer import END_THINK, IM_END, THINK, build_tokenizer

log = logging.getLogger(__name__)


class TinyModelCheckError(RuntimeError):
    """The pretrained tiny model failed its teacher-gap or accuracy-range check."""


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
    if fmt == "fact":
        prompt = prompts.render(tokenizer, fact_message(p), prompts.STUDENT)
        return prompt, p.steps()[0] + IM_END
    if fmt == "student":
        prompt = prompts.render(tokenizer, prompts.student_message(p.problem), prompts.STUDENT)
    elif fmt == "eval":
        prompt = prompts.render(tokenizer, prompts.eval_message(p.problem), prompts.EVAL)
    elif fmt == "teacher":
        prompt = prompts.render(tokenizer, prompts.teacher_message(p.problem, p.reference_solution(style)), prompts.TEACHER)
    else:
        raise ValueError(f"unknown prompt format {fmt!r}")
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
    computation slips at ``slip_rate`` a step (student and evaluation formats; a teacher after its
    detour); the privileged teacher copying the quoted solution does not; nor does a ``fact``
    example (``fact_fraction``): one step of an easy problem, stated right."""
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
        if fmt == "fact":
            texts += [fact_message(p), "user\nassistant\n" + p.steps()[0]]
            continue
        if fmt == "teacher":
            texts.append(prompts.teacher_message(p.problem, p.reference_solution(cfg.reference_solution)))
        elif fmt == "eval":
            texts.append(prompts.eval_message(p.problem))
        else:
            texts.append(prompts.student_message(p.problem))
        texts.append("user\nassistant\n" + response_text(p, thinking=fmt == "eval"))
    return texts


def tiny_tokenizer(cfg: TinyBuildConfig, corpus_size: int = 3000):
    """The tiny model's tokenizer: a byte-level BPE on :func:`tokenizer_corpus` plus the prompt
    templates' constant sentences as single tokens (:func:`pwopsd.prompts.fixed_phrases`)."""
    return build_tokenizer(tokenizer_corpus(cfg, corpus_size), cfg.vocab_size, prompts.fixed_phrases())


def build_model(cfg: TinyBuildConfig, tokenizer):
    import torch

    from transformers import Qwen3Config, Qwen3ForCausalLM

    vocab = int(math.ceil(len(tokenizer) / 64) * 64)
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(cfg.seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def untrained_tokens(tokenizer, response: str, span: tuple[int, int]) -> set[int]:
    """Indices of the response's tokens that overlap the character span ``span`` (a negative
    result's minus sign is one token with the space before it, which is then left out too)."""
    enc = tokenizer(response, add_special_tokens=False, return_offsets_mapping=True)
    return {i for i, (a, b) in enumerate(enc["offset_mapping"]) if a < span[1] and b > span[0]}


def collate(tokenizer, pairs: list[tuple]) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:
    """Right-padded input ids, attention mask and labels (-100 on prompt and padding, and on the
    tokens of a third element's character span of the response: a teacher detour's masked slip)."""
    import torch

    seqs, labels = [], []
    for prompt, response, *span in pairs:
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        r = tokenizer(response, add_special_tokens=False)["input_ids"]
        skip = untrained_tokens(tokenizer, response, span[0]) if span else set()
        seqs.append(p + r)
        labels.append([-100] * len(p) + [-100 if i in skip else t for i, t in enumerate(r)])
    width = max(len(s) for s in seqs)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs])
    lab = torch.tensor([lbl + [-100] * (width - len(lbl)) for lbl in labels])
    attn = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    return ids, attn, lab


def lr_at(step: int, cfg: TinyBuildConfig) -> float:
    """Linear warm-up, cosine decay to ``min_lr_ratio`` over ``steps``, then constant."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cosine)


# The quick check's few problems (60 a format) spread about 6 points around the whole dev set's
# accuracy: it asks for this much more, so that the whole dev set, which costs 5x as much, is
# rarely checked in vain.
QUICK_CHECK_EXTRA_MARGIN = 0.05


def is_check_step(step: int, cfg: TinyBuildConfig) -> bool:
    """Whether the quick dev check runs after ``step`` optimizer steps."""
    return step >= cfg.check_from and (step - cfg.check_from) % cfg.check_every == 0


@dataclass
class Pretraining:
    """What :func:`pretrain` did: per-step losses, the dev checks it ran and the full dev
    accuracy of the model it stopped with (``None`` when it never got there)."""

    losses: list[float]
    checks: list[dict]
    dev_accuracy: dict | None

    @property
    def steps(self) -> int:
        return len(self.losses)


def pretraining_optimizer(model, cfg: TinyBuildConfig):
    """AdamW over the model's parameters, without weight decay on the vectors (norms)."""
    import torch

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.98),
    )


def pretraining_backward(model, tokenizer, batch: list, cfg: TinyBuildConfig, rows: slice = slice(None)) -> float:
    """Forward and backward of a pretraining step's examples, gradients accumulated into the
    parameters: each length bucket's mean loss weighted by its share of the step's target tokens.
    ``rows`` takes a part of every bucket (e.g. one process's half, ``benchmarks/tiny_build_processes.py``),
    padded and weighted as in the whole step. Returns the part's loss."""
    # Teacher prompts are ~3x longer than student ones: two length buckets waste less padding.
    buckets = [[b for b in batch if b[1] == "teacher"], [b for b in batch if b[1] != "teacher"]]
    encoded = [collate(tokenizer, [format_example(tokenizer, p, fmt, cfg.reference_solution, slips) for p, fmt, slips in bk])
               for bk in buckets if bk]
    n_tokens = sum(int((lab[:, 1:] != -100).sum()) for _, _, lab in encoded)
    loss = 0.0
    for ids, attn, labels in encoded:
        ids, attn, labels = ids[rows], attn[rows], labels[rows]
        if len(ids) == 0:
            continue
        part = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        part = part * int((labels[:, 1:] != -100).sum()) / n_tokens
        part.backward()
        loss += float(part.detach())
    return loss


def pretrain(model, tokenizer, cfg: TinyBuildConfig, log_every: int = 50) -> Pretraining:
    """Pretrain until the model passes the build check with ``check_margin`` to spare (see the
    module's docstring), at most ``max_steps`` steps."""
    import torch

    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    opt = pretraining_optimizer(model, cfg)
    losses, checks = [], []
    t0 = time.time()
    for step in range(cfg.max_steps):
        model.train()
        batch = [sample_pretraining_example(rng, cfg) for _ in range(cfg.batch_size)]
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        opt.zero_grad(set_to_none=True)
        loss = pretraining_backward(model, tokenizer, batch, cfg)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        losses.append(loss)
        done = step + 1
        if done % log_every == 0 or step == 0:
            log.info("pretrain step %d (of at most %d) loss %.4f lr %.2e (%.1fs)", done, cfg.max_steps, loss,
                     lr_at(step, cfg), time.time() - t0)
        if not is_check_step(done, cfg):
            continue
        model.eval()
        quick = dev_accuracy(model, tokenizer, cfg, per_level=cfg.check_per_level)
        ready = not check_dev_accuracy(quick, cfg, margin=cfg.check_margin + QUICK_CHECK_EXTRA_MARGIN)
        full = dev_accuracy(model, tokenizer, cfg) if ready else None
        passed = ready and not check_dev_accuracy(full, cfg, margin=cfg.check_margin)
        checks.append({"step": done, "quick": _means(quick), "full": _means(full) if full else None, "passed": passed})
        log.info("dev check at step %d: quick %s%s", done, _means(quick),
                 f", full {_means(full)}{'' if passed else ' (outside the targets: training on)'}" if full else "")
        if passed:
            return Pretraining(losses, checks, full)
    model.eval()
    return Pretraining(losses, checks, None)


def _means(acc: dict) -> dict[str, float]:
    return {fmt: round(v["mean"], 4) for fmt, v in acc.items()}


def dev_accuracy(model, tokenizer, cfg: TinyBuildConfig, batch_size: int = 256, per_level: int | None = None) -> dict[str, dict[str, float]]:
    """Sampled (T=1, top_p 0.95, top_k off) accuracy per level for the three prompt formats, on
    the dev set's first ``per_level`` problems of each level (all ``dev_per_level`` by default);
    with ``min_greedy_accuracy``, also the student prompt's greedy accuracy (``student_greedy``):
    a model that knows its facts takes the right result at every step when it does not sample."""
    from pwopsd.generation import GenerationRequest
    from pwopsd.generation.hf_backend import HFBackend
    from pwopsd.evaluation.grading import integer_answer

    backend = HFBackend(model, tokenizer, batch_size=batch_size)
    # Every format and level in one call: full batches (a sample depends on its prompt and seed
    # only, not on the rows beside it).
    cells, reqs = [], []
    formats = ("student", "eval", "teacher") + (("student_greedy",) if cfg.min_greedy_accuracy > 0 else ())
    for fmt in formats:
        greedy = fmt == "student_greedy"
        for level in cfg.levels:
            problems = sample_problems(cfg.dev_seed + level, per_level or cfg.dev_per_level, [level], cfg.max_operand, cfg.max_value)
            cells.append((fmt, level, problems))
            for i, p in enumerate(problems):
                prompt, _ = format_example(tokenizer, p, "student" if greedy else fmt, cfg.reference_solution)
                ids = prompts.encode(tokenizer, prompt, add_special_tokens=False)
                reqs.append(GenerationRequest(tuple(ids), n=1, seed=i, temperature=0.0 if greedy else 1.0,
                                              top_p=0.95, top_k=0, max_new_tokens=96))
    outs = iter(backend.generate(reqs))
    result: dict[str, dict[str, float]] = {}
    for fmt, level, problems in cells:
        correct = [integer_answer(next(outs)[0].text) == p.answer for p in problems]
        result.setdefault(fmt, {})[f"L{level}"] = float(np.mean(correct))
    for fmt in result:
        result[fmt]["mean"] = float(np.mean([result[fmt][f"L{lv}"] for lv in cfg.levels]))
    return result


def check_dev_accuracy(acc: dict[str, dict[str, float]], cfg: TinyBuildConfig, margin: float = 0.0) -> list[str]:
    """Problems with the pretrained model, as readable sentences (empty list: all good). With a
    ``margin``, the targets are that much stricter: the range shrinks by it on both sides and the
    teacher's gap grows by it (the quick check that decides when pretraining may stop)."""
    problems = []
    gap = acc["teacher"]["mean"] - acc["student"]["mean"]
    eps = 1e-9  # accuracies are fractions of counts: a gap exactly at the threshold passes
    spare = f" with {margin:.0%} to spare" if margin else ""
    if gap < cfg.min_teacher_gap + margin - eps:
        problems.append(
            f"privileged teacher beats the student by {gap:+.1%} on the dev set, below "
            f"tiny.min_teacher_gap={cfg.min_teacher_gap:.0%}{spare} (teacher {acc['teacher']['mean']:.1%}, "
            f"student {acc['student']['mean']:.1%})"
        )
    lo, hi = cfg.student_accuracy_range
    for fmt in ("student", "eval"):
        if not lo + margin - eps <= acc[fmt]["mean"] <= hi - margin + eps:
            problems.append(
                f"{fmt}-prompt accuracy {acc[fmt]['mean']:.1%} lies outside "
                f"tiny.student_accuracy_range=[{lo:.0%}, {hi:.0%}]{spare}"
            )
    greedy = acc.get("student_greedy", {}).get("mean")
    if cfg.min_greedy_accuracy > 0 and (greedy is None or greedy < cfg.min_greedy_accuracy - eps):
        shown = "not measured" if greedy is None else f"{greedy:.1%}"
        problems.append(
            f"the student does not know its facts: greedy student-prompt accuracy {shown}, below "
            f"tiny.min_greedy_accuracy={cfg.min_greedy_accuracy:.0%} (its errors are not only slips)"
        )
    return problems


def not_ready_message(result: Pretraining, cfg: TinyBuildConfig) -> str:
    """Why a pretraining that ran ``max_steps`` without passing failed, and what to change."""
    last = result.checks[-1] if result.checks else None
    lines = [f"tiny model not ready after tiny.max_steps={cfg.max_steps} pretraining steps "
             f"(quick dev checks every {cfg.check_every} steps from step {cfg.check_from})"]
    if last is not None:
        acc = {fmt: {"mean": v} for fmt, v in (last["full"] or last["quick"]).items()}
        which = "whole dev set" if last["full"] else "quick check"
        margin = cfg.check_margin + (0.0 if last["full"] else QUICK_CHECK_EXTRA_MARGIN)
        lines += [f"last check (step {last['step']}, {which}): {p}" for p in check_dev_accuracy(acc, cfg, margin)]
    if last is not None and last["quick"]["student"] > cfg.student_accuracy_range[1] - cfg.check_margin - QUICK_CHECK_EXTRA_MARGIN:
        lines.append("the student got too good before the teacher pulled ahead: lower tiny.check_from or tiny.check_every")
    else:
        lines.append("raise tiny.max_steps (or tiny.steps, the length of the learning-rate decay)")
    return "\n  - ".join(lines)
