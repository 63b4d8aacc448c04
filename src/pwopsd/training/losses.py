"""Token-level distillation losses of the paper and its baselines (reference forms).

Shapes: logits ``[B, T, V]`` at the completion positions (already sliced so that position ``t``
predicts token ``tokens[:, t]``), ``mask``/``tokens`` ``[B, T]``. ``mask`` is 1 at valid
(supervised) positions. All reductions follow ``../shared/spec/reference_implementation.md`` §2:

* :func:`opsd_loss`: full-vocabulary forward KL(teacher || student) at temperature ``temperature``,
  each vocabulary term clamped from above at ``clip``, global mean over valid tokens.
* :func:`pwopsd_loss`: the same per-token term weighted by :func:`position_weights`, reduced per
  sequence (mean over each row's valid tokens, then mean over rows with any) or globally.
* :func:`eopd_loss`: PPO-clipped sampled-token reverse-KL advantage plus an entropy-gated top-k
  forward KL (Jin et al. 2026, as the reference implements it).
* :func:`reopold_loss`: REOPOLD's clipped log-ratio reward policy gradient with the exploration /
  refinement phase switch (Ko et al. 2026, as the reference implements it).

Beyond the paper, two baselines its related work discusses (docs/decisions.md, "Baselines beyond
the paper"), on the same rollouts and privileged teacher, with OPSD's temperature, per-vocabulary
clip and global token mean:

* :func:`gkd_loss`: GKD's generalized Jensen-Shannon divergence JSD(beta) on student samples
  (Agarwal et al. 2024), as TRL's ``generalized_jsd_loss`` computes it (beta = 0: forward KL, so
  ``gkd`` with beta 0 is OPSD; beta = 1: reverse KL).
* :func:`todi_loss`: ToDi's per-vocabulary-token mix of forward and reverse KL, weighted by a
  sigmoid of the teacher-student log-ratio (Jung et al. 2025).

Every parameter is a required keyword: the defaults (the paper's settings) live only in the config
schema (``pwopsd.training.registry.loss_keywords`` returns them). ``upcast`` is not a config default but the
fp32 computation of the reference forms (the trainer passes ``training.opsd_upcast``).

These forms materialize ``[B, T, V]`` tensors; the training path computes the same values in
sequence chunks from hidden states (``pwopsd.training.chunked``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from pwopsd.schedule import schedule_weight


def normalized_positions(mask: torch.Tensor) -> torch.Tensor:
    """``r = (k - 0.5) / L_i`` for the k-th valid token of row i (k = 1..L_i); 0 elsewhere."""
    m = mask.to(torch.float32)
    lengths = m.sum(dim=1, keepdim=True).clamp(min=1.0)
    k = torch.cumsum(m, dim=1)
    return torch.clamp(k - 0.5, min=0.0) * m / lengths




def position_weights(mask: torch.Tensor, *, w_min: float, tau: float, s: float) -> torch.Tensor:
    """PW-OPSD weights ``w(r)`` at each row's normalized positions, 0 at invalid positions."""
    w = schedule_weight(normalized_positions(mask), w_min=w_min, tau=tau, s=s)
    return (w * mask.to(w.dtype)).detach()


def clipped_forward_kl_terms(student_logits: torch.Tensor, teacher_logits: torch.Tensor, *, temperature: float,
                             clip: float | None, upcast: bool = True) -> torch.Tensor:
    """Per-token ``sum_j min(p_T(j) (log p_T(j) - log p_S(j)), clip)`` ``[B, T]``.

    ``upcast=False`` keeps the input dtype (the reference OPSD baseline runs this in bf16).
    """
    s, t = student_logits, teacher_logits.detach()
    if upcast:
        s, t = s.float(), t.float()
    log_ps = F.log_softmax(s / temperature, dim=-1)
    log_pt = F.log_softmax(t / temperature, dim=-1)
    terms = F.kl_div(log_ps, log_pt, reduction="none", log_target=True)  # p_T (log p_T - log p_S)
    return _clipped_sum(terms, clip)


def _clipped_sum(terms: torch.Tensor, clip: float | None) -> torch.Tensor:
    """Per-vocabulary divergence terms clamped from above at ``clip`` (the reference's per-vocab
    clip), summed over the vocabulary."""
    if clip is not None:
        terms = terms.clamp(max=clip)
    return terms.sum(dim=-1)


def _zero_with_grad(x: torch.Tensor) -> torch.Tensor:
    return (x.sum() * 0.0).float()


def opsd_loss(student_logits, teacher_logits, mask, *, temperature: float, clip: float | None,
              upcast: bool = True) -> torch.Tensor:
    per_token = clipped_forward_kl_terms(student_logits, teacher_logits, temperature=temperature, clip=clip, upcast=upcast)
    return _token_mean(per_token, mask, student_logits)


def pwopsd_loss(student_logits, teacher_logits, mask, *, temperature: float, clip: float | None,
                w_min: float, tau: float, s: float, reduction: str) -> torch.Tensor:
    per_token = clipped_forward_kl_terms(student_logits, teacher_logits, temperature=temperature, clip=clip)
    return reduce_weighted(per_token, mask, position_weights(mask, w_min=w_min, tau=tau, s=s), reduction=reduction)


def reduce_weighted(per_token: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor, *, reduction: str) -> torch.Tensor:
    """PW-OPSD reductions of weighted per-token losses (shared by the reference and chunked paths)."""
    m = mask.to(torch.float32)
    wl = weights * per_token * m
    if reduction == "global":
        n = m.sum()
        return wl.sum() / n if n > 0 else _zero_with_grad(per_token)
    if reduction != "per_sequence":
        raise ValueError(f"reduction must be 'per_sequence' or 'global', got {reduction!r}")
    lengths = m.sum(dim=1)
    has = lengths > 0
    if not bool(has.any()):
        return _zero_with_grad(per_token)
    per_seq = wl.sum(dim=1) / lengths.clamp(min=1.0)
    return (per_seq * has).sum() / has.sum().clamp(min=1)


def pwopsd_coefficients(mask: torch.Tensor, *, w_min: float, tau: float, s: float, reduction: str) -> torch.Tensor:
    """The same reductions as :func:`reduce_weighted`, as ``[B, T]`` per-token coefficients ``c`` with
    loss ``= sum c * l`` (what the chunked training path needs, :mod:`pwopsd.training.chunked`). The
    reference form above keeps the reference's operation order (sum, then divide); the two are
    tested equal in value and gradient."""
    m = mask.to(torch.float32)
    w = position_weights(mask, w_min=w_min, tau=tau, s=s)
    if reduction == "global":
        return w * m / m.sum().clamp(min=1.0)
    if reduction != "per_sequence":
        raise ValueError(f"reduction must be 'per_sequence' or 'global', got {reduction!r}")
    lengths = m.sum(dim=1, keepdim=True)
    rows = (lengths > 0).sum().clamp(min=1)
    return w * m / lengths.clamp(min=1.0) / rows


def _log_probs(student_logits, teacher_logits, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 log-softmaxes of the student and the (detached) teacher at ``temperature``."""
    return (F.log_softmax(student_logits.float() / temperature, dim=-1),
            F.log_softmax(teacher_logits.detach().float() / temperature, dim=-1))


def _token_mean(per_token: torch.Tensor, mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Global mean over valid tokens (OPSD's reduction, TRL's ``batchmean`` with labels)."""
    m = mask.to(torch.float32)
    n = m.sum()
    return (per_token.float() * m).sum() / n if n > 0 else _zero_with_grad(like)


def generalized_jsd_terms(student_logits, teacher_logits, *, beta: float, temperature: float,
                          clip: float | None) -> torch.Tensor:
    """Per-token generalized JSD ``[...]``: with teacher T, student S and the mixture
    ``M = beta T + (1 - beta) S``, ``sum_j min(beta T_j log(T_j / M_j) + (1 - beta) S_j log(S_j / M_j), clip)``;
    at beta = 0 the forward KL(T || S), at beta = 1 the reverse KL(S || T) (TRL's convention)."""
    log_ps, log_pt = _log_probs(student_logits, teacher_logits, temperature)
    if beta == 0:
        terms = F.kl_div(log_ps, log_pt, reduction="none", log_target=True)  # T (log T - log S)
    elif beta == 1:
        terms = F.kl_div(log_pt, log_ps, reduction="none", log_target=True)  # S (log S - log T)
    else:
        log_m = torch.logsumexp(torch.stack([log_ps + math.log1p(-beta), log_pt + math.log(beta)]), dim=0)
        terms = (beta * F.kl_div(log_m, log_pt, reduction="none", log_target=True)
                 + (1 - beta) * F.kl_div(log_m, log_ps, reduction="none", log_target=True))
    return _clipped_sum(terms, clip)


def gkd_loss(student_logits, teacher_logits, mask, *, temperature: float, clip: float | None, beta: float) -> torch.Tensor:
    return _token_mean(generalized_jsd_terms(student_logits, teacher_logits, beta=beta, temperature=temperature, clip=clip),
                       mask, student_logits)


def todi_terms(student_logits, teacher_logits, *, beta: float, temperature: float, clip: float | None) -> torch.Tensor:
    """Per-token ToDi divergence ``[...]``: for each vocabulary entry j, with
    ``alpha_j = sigmoid(beta (log T_j - log S_j))`` (a weight, no gradient),
    ``min(alpha_j T_j log(T_j / S_j) + (1 - alpha_j) S_j log(S_j / T_j), clip)``, summed over j:
    forward KL where the student underestimates the teacher, reverse KL where it overestimates."""
    log_ps, log_pt = _log_probs(student_logits, teacher_logits, temperature)
    alpha = torch.sigmoid(beta * (log_pt - log_ps)).detach()
    terms = (alpha * F.kl_div(log_ps, log_pt, reduction="none", log_target=True)
             + (1 - alpha) * F.kl_div(log_pt, log_ps, reduction="none", log_target=True))
    return _clipped_sum(terms, clip)


def todi_loss(student_logits, teacher_logits, mask, *, temperature: float, clip: float | None, beta: float) -> torch.Tensor:
    return _token_mean(todi_terms(student_logits, teacher_logits, beta=beta, temperature=temperature, clip=clip),
                       mask, student_logits)


def _gather(logp: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return logp.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)


def eopd_token_loss(student_logits, teacher_logits, tokens, *, temperature: float, entropy_threshold: float,
                    top_k: int, ppo_eps: float) -> torch.Tensor:
    """Per-token EOPD loss ``L_OPD + gate * L_FKL`` for logits ``[..., V]`` and tokens ``[...]``."""
    s = student_logits.float() / temperature
    t = teacher_logits.detach().float() / temperature
    log_ps = F.log_softmax(s, dim=-1)
    log_pt = F.log_softmax(t, dim=-1)
    lps_y, lpt_y = _gather(log_ps, tokens), _gather(log_pt, tokens)
    adv = lpt_y - lps_y.detach()
    ratio = torch.exp(lps_y - lps_y.detach())
    l_opd = torch.maximum(-ratio * adv, -torch.clamp(ratio, 1 - ppo_eps, 1 + ppo_eps) * adv)
    top_vals, top_idx = t.topk(min(top_k, t.shape[-1]), dim=-1)
    log_pt_top = F.log_softmax(top_vals, dim=-1)
    l_fkl = (log_pt_top.exp() * (log_pt_top - log_ps.gather(-1, top_idx))).sum(-1)
    h_t = -(log_pt.exp() * log_pt).sum(-1)
    gate = (h_t > entropy_threshold).float()
    return l_opd + gate * l_fkl


def eopd_loss(student_logits, teacher_logits, tokens, mask, *, temperature: float, entropy_threshold: float,
              top_k: int, ppo_eps: float) -> torch.Tensor:
    per_token = eopd_token_loss(student_logits, teacher_logits, tokens, temperature=temperature,
                                entropy_threshold=entropy_threshold, top_k=top_k, ppo_eps=ppo_eps)
    return _token_mean(per_token, mask, student_logits)


def reopold_floor(lam: float) -> float:
    if not 0 < lam < 1:
        raise ValueError(f"REOPOLD lambda must lie in (0, 1), got {lam}")
    return math.log(lam) / (1 - lam)


def reopold_loss(student_logits, teacher_logits, tokens, mask, *, temperature: float, lam: float,
                 beta: float, step: int, t_switch: int) -> torch.Tensor:
    valid = mask.to(torch.float32)
    log_ps = F.log_softmax(student_logits.float() / temperature, dim=-1)
    log_pt = F.log_softmax(teacher_logits.detach().float() / temperature, dim=-1)
    lps_y = _gather(log_ps, tokens) * valid
    lpt_y = _gather(log_pt, tokens) * valid
    reward = torch.nan_to_num(lpt_y - lps_y.detach(), nan=0.0, posinf=0.0, neginf=-1e30)
    floor = reopold_floor(lam)
    clipped = torch.clamp(reward, min=floor).detach()
    if step < t_switch:  # exploration: drop tokens whose reward was clipped
        keep = (reward >= floor).float()
    else:  # refinement: the top-beta student-entropy tokens of this micro-batch
        with torch.no_grad():
            h = -(log_ps.exp() * log_ps).sum(-1)
            hv = h[valid > 0]
            q = torch.quantile(hv, 1 - beta) if hv.numel() else h.new_tensor(float("inf"))
            keep = (h >= q).float()
    keep = keep * valid
    return -(clipped * keep * lps_y).sum() / keep.sum().clamp(min=1.0)
