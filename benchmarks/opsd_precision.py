"""How much does computing the OPSD loss in bf16 (the reference's baseline, ``training.opsd_upcast:
false``) move its gradient, next to the fp32 loss every PW-OPSD run uses, at Qwen3's vocabulary of
151,936 tokens (issue 52, item 7)?

    python benchmarks/opsd_precision.py [--tokens 128] [--vocab 151936] [--seeds 3]

Per seed: student and teacher logits of ``--tokens`` positions drawn as a language model's are
(heavy-tailed, a few candidates far above the rest, the teacher sharper and shifted on some of
them), cast to bf16 as the model emits them. The per-token clipped forward KL (clip 0.05,
temperature 1.1: the paper's) and its gradient with respect to the student logits are computed
three ways from the same bf16 logits: in float64 (the reference), in fp32 (``upcast: true``) and in
bf16 (``upcast: false``), through the project's own loss function
(:func:`pwopsd.training.losses.clipped_forward_kl_terms`). Printed: each path's relative error of the
loss and the gradient against float64, the gradient's cosine with float64's, and, for scale, how far
PW-OPSD Moderate's per-token weights move the same gradient (the difference Table 2 measures).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pwopsd.training.losses import clipped_forward_kl_terms, position_weights  # noqa: E402


def lm_like_logits(tokens: int, vocab: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Student and teacher logits in bf16: a Gumbel background (the long tail of an LM's vocabulary),
    8 candidates per position lifted 8-16 nats above it; the teacher lifts the first candidate
    further (it knows the answer) and disagrees with the student on the others."""
    base = -torch.log(-torch.log(torch.rand(tokens, vocab, generator=gen, dtype=torch.float64).clamp_min(1e-12)))
    cand = torch.randint(0, vocab, (tokens, 8), generator=gen)
    lift = 8 + 8 * torch.rand(tokens, 8, generator=gen, dtype=torch.float64)
    student = base.clone().scatter_add_(1, cand, lift)
    teacher = base.clone().scatter_add_(1, cand, lift + torch.randn(tokens, 8, generator=gen, dtype=torch.float64) * 2)
    teacher.scatter_add_(1, cand[:, :1], torch.full((tokens, 1), 4.0, dtype=torch.float64))
    return student.to(torch.bfloat16), teacher.to(torch.bfloat16)


def loss_and_grad(student: torch.Tensor, teacher: torch.Tensor, dtype: torch.dtype, weights: torch.Tensor | None = None):
    """The mean (or ``weights``-weighted mean) per-token clipped forward KL computed in ``dtype``, and
    its gradient with respect to the student logits, in float64."""
    s = student.to(dtype).requires_grad_(True)
    per_token = clipped_forward_kl_terms(s, teacher.to(dtype), temperature=1.1, clip=0.05, upcast=False)
    w = torch.ones_like(per_token) if weights is None else weights.to(per_token.dtype)
    loss = (per_token * w).sum() / w.sum()
    loss.backward()
    return loss.double().item(), s.grad.double()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args(argv)
    rows = []
    for seed in range(args.seeds):
        gen = torch.Generator().manual_seed(seed)
        student, teacher = lm_like_logits(args.tokens, args.vocab, gen)
        l64, g64 = loss_and_grad(student, teacher, torch.float64)
        mask = torch.ones(1, args.tokens)
        w = position_weights(mask, w_min=0.25, tau=0.30, s=0.10)[0]
        _, gpw = loss_and_grad(student, teacher, torch.float64, w)
        for name, dtype in (("fp32 (upcast: true)", torch.float32), ("bf16 (upcast: false)", torch.bfloat16)):
            loss, grad = loss_and_grad(student, teacher, dtype)
            cos = torch.nn.functional.cosine_similarity(grad.flatten(), g64.flatten(), dim=0).item()
            rows.append((seed, name, abs(loss - l64) / abs(l64), rel(grad, g64), cos, rel(gpw, g64)))
    print(f"OPSD loss at vocabulary {args.vocab:,}, {args.tokens} positions, clip 0.05, temperature 1.1; against float64:")
    print("| seed | computed in | loss rel. error | gradient rel. error | gradient cosine | PW-OPSD Moderate's weights move the gradient by |")
    print("|---|---|---|---|---|---|")
    for seed, name, le, ge, cos, pw in rows:
        print(f"| {seed} | {name} | {le:.2e} | {ge:.2e} | {cos:.6f} | {pw:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
