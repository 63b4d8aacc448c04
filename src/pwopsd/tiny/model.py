"""Build, pretrain and check the tiny Qwen3 model (its recipe and examples:
:mod:`pwopsd.tiny.examples`).

Pretraining stops when the model is ready: every ``check_every`` steps from ``check_from`` on (tiny
mode: the end of the decay), a quick dev check (the first ``check_per_level`` problems of each
level of the dev set, from a seed disjoint from every benchmark's) asks for the build check's
targets with ``check_margin`` to spare (student and evaluation prompts inside the accuracy range
shrunk by the margin, the privileged teacher ahead by the gap plus the margin, and with
``min_greedy_accuracy`` the student knowing its facts: its greedy accuracy, which takes no margin);
when the quick check passes, the whole dev set must meet the same targets, margin included, and the
model it accepts passes the build check with that margin to spare. The learning rate warms up,
decays by a cosine over ``steps`` and then stays at its minimum; a model that is not ready by
``max_steps`` fails the build with :class:`TinyModelCheckError`, naming its last check and what to
change.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from dataclasses import dataclass

import numpy as np

from pwopsd import prompts
from pwopsd.tiny.arithmetic import sample_problems
from pwopsd.tiny.examples import TinyBuildConfig, format_example, sample_pretraining_example

log = logging.getLogger(__name__)


class TinyModelCheckError(RuntimeError):
    """The pretrained tiny model failed its build check (teacher gap, accuracy range, facts)."""


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


# The build's weights are fingerprinted after this many steps (the build report's ``first_steps``):
# the digest then holds what a host's first pretraining steps must give, which a 10-second test
# compares long before the tiny run ends (tests/test_first_steps.py).
FINGERPRINT_STEPS = 20


def weights_fingerprint(model) -> str:
    """The first 16 hex digits of the SHA-256 of the model's weights (sorted by name, float32 bytes)."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode() + p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


@dataclass
class Pretraining:
    """What :func:`pretrain` did: per-step losses, the dev checks it ran, the full dev accuracy of
    the model it stopped with (``None`` when it never got there) and the weights' fingerprint after
    :data:`FINGERPRINT_STEPS` steps (``None`` when it stopped before)."""

    losses: list[float]
    checks: list[dict]
    dev_accuracy: dict | None
    first_steps: str | None = None

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
    losses, checks, first_steps = [], [], None
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
        if done == FINGERPRINT_STEPS:
            first_steps = weights_fingerprint(model)
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
            return Pretraining(losses, checks, full, first_steps)
    model.eval()
    return Pretraining(losses, checks, None, first_steps)


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
