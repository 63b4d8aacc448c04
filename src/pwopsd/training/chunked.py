"""Distillation losses computed from hidden states in token chunks (the training path).

At paper scale the reference forms in :mod:`pwopsd.training.losses` need fp32 ``[B, T, V]`` logits for the
student and the teacher (B=4, T=1024, V=151,936: ~2.5 GB per copy, several copies with the
softmaxes). Here every loss is written as ``sum_{b,t} c[b,t] * l(z_S[b,t], z_T[b,t], y[b,t])`` with
detached per-token coefficients ``c`` (the reduction: masks, position weights, normalizers) and a
per-token term ``l``. Only valid tokens are processed, ``chunk_size`` at a time: the chunk's logits
``h @ W^T`` are formed, the chunk's loss and its gradient with respect to the student hidden states
are computed at once (as Liger-Kernel's chunked distillation losses do), and the logits are freed.
Backward then only scales the stored gradient. Values and gradients equal the reference forms.

REOPOLD's coefficients depend on statistics of the whole micro-batch (the kept-token count, the
student-entropy quantile), so it makes a cheap no-grad pre-pass over the chunks first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from pwopsd.training import losses as L

TokenLoss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (zs [n,V], zt [n,V], y [n]) -> [n]


class _ChunkedWeightedSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h_s, h_t, weight, tokens, coeff, token_loss: TokenLoss, chunk_size: int):
        grad_h = torch.zeros_like(h_s) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[2] else None
        total = torch.zeros((), dtype=torch.float32, device=h_s.device)
        w_det = weight.detach()
        for start in range(0, h_s.shape[0], chunk_size):
            sl = slice(start, start + chunk_size)
            with torch.enable_grad():
                hs = h_s[sl].detach().requires_grad_(grad_h is not None)
                w = w_det.requires_grad_(grad_w is not None) if grad_w is not None else w_det
                zs = hs @ w.T
                with torch.no_grad():
                    zt = h_t[sl] @ w_det.T
                part = (token_loss(zs, zt, tokens[sl]).float() * coeff[sl]).sum()
                wanted = [x for x, need in ((hs, grad_h is not None), (w, grad_w is not None)) if need]
                grads = torch.autograd.grad(part, wanted) if wanted else ()
            it = iter(grads)
            if grad_h is not None:
                grad_h[sl] = next(it)
            if grad_w is not None:
                grad_w += next(it).float()
                w_det = weight.detach()
            total += part.detach()
        ctx.save_for_backward(*(g for g in (grad_h, grad_w) if g is not None))
        ctx.has = (grad_h is not None, grad_w is not None)
        return total

    @staticmethod
    def backward(ctx, grad_out):
        saved = iter(ctx.saved_tensors)
        gh = next(saved) * grad_out if ctx.has[0] else None
        gw = (next(saved) * grad_out) if ctx.has[1] else None
        return gh, None, gw, None, None, None, None


def chunked_weighted_sum(h_s, h_t, weight, tokens, coeff, token_loss: TokenLoss, *, chunk_size: int):
    """``sum_i coeff[i] * token_loss(h_s[i] @ W^T, h_t[i] @ W^T, tokens[i])`` over flattened tokens."""
    if h_s.shape[0] == 0:
        return (h_s.sum() * 0.0).float()
    return _ChunkedWeightedSum.apply(h_s, h_t.detach(), weight, tokens, coeff.detach().float(), token_loss, int(chunk_size))


# ----------------------------------------------------------------------------------------------
# Per-token terms (the same formulas as pwopsd.training.losses, on [n, V] logits).


def _vocab_term(terms: Callable[..., torch.Tensor], **settings) -> TokenLoss:
    """A full-vocabulary per-token divergence of the reference forms (``terms(zs, zt, **settings)``:
    OPSD's clipped forward KL, GKD's generalized JSD, ToDi's mix) as a token loss."""
    def term(zs, zt, y):
        return terms(zs, zt, **settings)

    return term


def _eopd_term(temperature: float, entropy_threshold: float, top_k: int, ppo_eps: float) -> TokenLoss:
    def term(zs, zt, y):
        return L.eopd_token_loss(zs, zt, y, temperature=temperature, entropy_threshold=entropy_threshold,
                                 top_k=top_k, ppo_eps=ppo_eps)

    return term


@dataclass
class FlatBatch:
    """Valid tokens of a micro-batch, flattened: hidden states ``[N, H]``, tokens and positions."""

    h_s: torch.Tensor
    h_t: torch.Tensor
    tokens: torch.Tensor
    index: tuple[torch.Tensor, torch.Tensor]  # (rows, cols) of the valid positions


def flatten_valid(h_s, h_t, tokens, mask) -> FlatBatch:
    rows, cols = torch.nonzero(mask > 0, as_tuple=True)
    return FlatBatch(h_s[rows, cols], h_t[rows, cols], tokens[rows, cols].long(), (rows, cols))


def token_mean_chunked(h_s, h_t, weight, mask, term: TokenLoss, *, chunk_size):
    """The global mean over valid tokens of a full-vocabulary per-token ``term`` (OPSD, GKD, ToDi)."""
    flat = flatten_valid(h_s, h_t, torch.zeros_like(mask, dtype=torch.long), mask)
    n = flat.tokens.numel()
    coeff = torch.full((n,), 1.0 / max(n, 1), device=h_s.device)
    return chunked_weighted_sum(flat.h_s, flat.h_t, weight, flat.tokens, coeff, term, chunk_size=chunk_size)


def opsd_loss_chunked(h_s, h_t, weight, mask, *, temperature, clip, upcast=True, chunk_size):
    return token_mean_chunked(h_s, h_t, weight, mask, _vocab_term(L.clipped_forward_kl_terms, temperature=temperature,
                                                                  clip=clip, upcast=upcast), chunk_size=chunk_size)


def gkd_loss_chunked(h_s, h_t, weight, mask, *, temperature, clip, beta, chunk_size):
    return token_mean_chunked(h_s, h_t, weight, mask, _vocab_term(L.generalized_jsd_terms, temperature=temperature,
                                                                  clip=clip, beta=beta), chunk_size=chunk_size)


def todi_loss_chunked(h_s, h_t, weight, mask, *, temperature, clip, beta, chunk_size):
    return token_mean_chunked(h_s, h_t, weight, mask, _vocab_term(L.todi_terms, temperature=temperature, clip=clip,
                                                                  beta=beta), chunk_size=chunk_size)


def pwopsd_loss_chunked(h_s, h_t, weight, mask, *, temperature, clip, w_min, tau, s, reduction, chunk_size):
    coeff = L.pwopsd_coefficients(mask, w_min=w_min, tau=tau, s=s, reduction=reduction)
    flat = flatten_valid(h_s, h_t, torch.zeros_like(mask, dtype=torch.long), mask)
    return chunked_weighted_sum(flat.h_s, flat.h_t, weight, flat.tokens, coeff[flat.index],
                                _vocab_term(L.clipped_forward_kl_terms, temperature=temperature, clip=clip),
                                chunk_size=chunk_size)


def eopd_loss_chunked(h_s, h_t, weight, tokens, mask, *, temperature, entropy_threshold, top_k, ppo_eps, chunk_size):
    flat = flatten_valid(h_s, h_t, tokens, mask)
    n = flat.tokens.numel()
    coeff = torch.full((n,), 1.0 / max(n, 1), device=h_s.device)
    return chunked_weighted_sum(flat.h_s, flat.h_t, weight, flat.tokens, coeff,
                                _eopd_term(temperature, entropy_threshold, top_k, ppo_eps), chunk_size=chunk_size)


@torch.no_grad()
def chunk_log_probs(flat: FlatBatch, weight, temperature: float, chunk_size: int):
    """Yield ``(slice, log p_S, log p_T)`` of the flattened valid tokens, ``chunk_size`` at a time,
    without gradients: the statistics passes (REOPOLD's coefficients, the training log's KL and
    entropies) that need whole distributions but no backward."""
    for start in range(0, flat.tokens.numel(), chunk_size):
        sl = slice(start, start + chunk_size)
        log_ps = F.log_softmax((flat.h_s[sl] @ weight.T).float() / temperature, -1)
        log_pt = F.log_softmax((flat.h_t[sl] @ weight.T).float() / temperature, -1)
        yield sl, log_ps, log_pt


@torch.no_grad()
def _reopold_stats(flat: FlatBatch, weight, temperature: float, chunk_size: int):
    rewards, entropies = [], []
    for sl, log_ps, log_pt in chunk_log_probs(flat, weight, temperature, chunk_size):
        y = flat.tokens[sl, None]
        r = log_pt.gather(-1, y).squeeze(-1) - log_ps.gather(-1, y).squeeze(-1)
        rewards.append(torch.nan_to_num(r, nan=0.0, posinf=0.0, neginf=-1e30))
        entropies.append(-(log_ps.exp() * log_ps).sum(-1))
    return torch.cat(rewards), torch.cat(entropies)


def reopold_loss_chunked(h_s, h_t, weight, tokens, mask, *, temperature, lam, beta, step: int, t_switch, chunk_size):
    flat = flatten_valid(h_s, h_t, tokens, mask)
    if flat.tokens.numel() == 0:
        return (h_s.sum() * 0.0).float()
    floor = L.reopold_floor(lam)
    reward, entropy = _reopold_stats(flat, weight.detach(), temperature, chunk_size)
    if step < t_switch:
        keep = (reward >= floor).float()
    else:
        keep = (entropy >= torch.quantile(entropy, 1 - beta)).float()
    coeff = -torch.clamp(reward, min=floor) * keep / keep.sum().clamp(min=1.0)

    def term(zs, zt, y):
        return F.log_softmax(zs.float() / temperature, -1).gather(-1, y[:, None]).squeeze(-1)

    return chunked_weighted_sum(flat.h_s, flat.h_t, weight, flat.tokens, coeff, term, chunk_size=chunk_size)


# ----------------------------------------------------------------------------------------------
# The training path's losses by name (``methods.<name>.loss`` in the config; the schema's enum and
# per-loss parameter branches list the same names). Every entry takes the same arguments and uses
# the ones it needs; ``params`` are the method's (schema-validated) loss parameters.


def _opsd(h_s, h_t, weight, tokens, mask, *, step, temperature, clip, upcast, chunk_size, **params):
    return opsd_loss_chunked(h_s, h_t, weight, mask, temperature=temperature, clip=clip, upcast=upcast,
                             chunk_size=chunk_size, **params)


def _pwopsd(h_s, h_t, weight, tokens, mask, *, step, temperature, clip, upcast, chunk_size, **params):
    return pwopsd_loss_chunked(h_s, h_t, weight, mask, temperature=temperature, clip=clip, chunk_size=chunk_size, **params)


def _eopd(h_s, h_t, weight, tokens, mask, *, step, temperature, clip, upcast, chunk_size, **params):
    return eopd_loss_chunked(h_s, h_t, weight, tokens, mask, temperature=temperature, chunk_size=chunk_size, **params)


def _reopold(h_s, h_t, weight, tokens, mask, *, step, temperature, clip, upcast, chunk_size, **params):
    return reopold_loss_chunked(h_s, h_t, weight, tokens, mask, temperature=temperature, step=step,
                                chunk_size=chunk_size, **params)


def _gkd(h_s, h_t, weight, tokens, mask, *, step, temperature, clip, upcast, chunk_size, **params):
    return gkd_loss_chunked(h_s, h_t, weight, mask, temperature=temperature, clip=clip, chunk_size=chunk_size, **params)


def _todi(h_s, h_t, weight, tokens, mask, *, step, temperature, clip, upcast, chunk_size, **params):
    return todi_loss_chunked(h_s, h_t, weight, mask, temperature=temperature, clip=clip, chunk_size=chunk_size, **params)


LOSSES: dict[str, Callable[..., torch.Tensor]] = {"opsd": _opsd, "pwopsd": _pwopsd, "eopd": _eopd, "reopold": _reopold,
                                                  "gkd": _gkd, "todi": _todi}
