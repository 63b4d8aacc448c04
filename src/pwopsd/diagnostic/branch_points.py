"""Per-spine building blocks of the branch-viability diagnostic (paper Appendices A-B): the
streamed teacher pass (Phase B), candidate selection (Phase C), MC-dropout hooks (Phase D) and
forced-continuation requests (Phase E). :mod:`pwopsd.diagnostic.phases` runs the phases on tables."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np

from pwopsd.models import decoder_layers

# torch is imported inside the model-pass functions (decoder_layers, mc_dropout, teacher_pass):
# candidate selection and forced-continuation requests also run in the vLLM stack's jobs, and
# their tests run without torch (see docs/cluster.md, "Software stacks").


H_TRUNC_READINGS = ("valid_in_top_m", "top_m_valid")


def truncated_entropy(probs: Sequence[float], valid: Sequence[bool], top_m: int = 16,
                      reading: str = "valid_in_top_m") -> float:
    """Entropy of the renormalized "top-``top_m`` valid" tokens (``probs`` sorted descending).

    The paper's "top-16 valid-token truncated entropy" has two readings (``diagnostic.teacher_pass.h_trunc``):
    ``valid_in_top_m``: the valid tokens among the ``top_m`` most probable ones (fewer than ``top_m``
    where junk/special tokens rank high); ``top_m_valid``: the ``top_m`` most probable *valid* tokens
    (needs more than ``top_m`` stored tokens to differ). See docs/decisions.md.
    """
    if reading not in H_TRUNC_READINGS:
        raise ValueError(f"diagnostic.teacher_pass.h_trunc must be one of {H_TRUNC_READINGS}, got {reading!r}")
    p, v = np.asarray(probs, dtype=float), np.asarray(valid, dtype=bool)
    p = p[:top_m][v[:top_m]] if reading == "valid_in_top_m" else p[v][:top_m]
    if p.sum() <= 0:
        return 0.0
    q = p / p.sum()
    q = q[q > 0]
    return float(-(q * np.log(q)).sum())


@dataclass
class Candidate:
    position: int
    entropy: float
    children: list[int] = field(default_factory=list)
    p1: float = 0.0
    p2: float = 0.0


def select_candidates(top_ids: np.ndarray, top_probs: np.ndarray, is_valid: Callable[[int], bool], *,
                      boxed_start: int | None, max_candidates: int = 5, spacing: int = 64, p2_min: float = 0.02,
                      ratio_min: float = 0.10, n_children: int = 3, top_m: int = 16,
                      h_trunc: str = "valid_in_top_m") -> list[Candidate]:
    """Phase C on one spine.

    ``top_ids``/``top_probs`` ``[T, K]``: the teacher's top-K next tokens at each spine position,
    sorted by probability. Junk/EOS/special tokens are dropped by ``is_valid``; a position is
    plausible when its two most likely valid tokens satisfy ``p2 >= p2_min`` and
    ``p2 / p1 >= ratio_min``; positions at or after ``boxed_start`` are skipped. Among plausible
    positions, the highest truncated-entropy (:func:`truncated_entropy`, reading ``h_trunc``) ones are taken greedily, at least ``spacing`` tokens
    apart, up to ``max_candidates``; each keeps its top ``n_children`` valid tokens as the forced
    alternatives.
    """
    T = top_ids.shape[0]
    pool = []
    for t in range(T if boxed_start is None else min(T, boxed_start)):
        valid = [is_valid(int(i)) for i in top_ids[t]]
        ids = [int(i) for i, v in zip(top_ids[t], valid) if v]
        ps = [float(p) for p, v in zip(top_probs[t], valid) if v]
        if len(ids) < 2:
            continue
        p1, p2 = ps[0], ps[1]
        eps = 1e-9  # the thresholds are inclusive; do not lose exact boundary values to rounding
        if p2 < p2_min - eps or p2 / p1 < ratio_min - eps:
            continue
        pool.append(Candidate(t, truncated_entropy(top_probs[t], valid, top_m, h_trunc), ids[:n_children], p1, p2))
    pool.sort(key=lambda c: (-c.entropy, c.position))
    chosen: list[Candidate] = []
    for c in pool:
        if len(chosen) >= max_candidates:
            break
        if all(abs(c.position - o.position) >= spacing for o in chosen):
            chosen.append(c)
    return sorted(chosen, key=lambda c: c.position)


@contextlib.contextmanager
def mc_dropout(model, *, last_layers: int, p: float, layers: str) -> Iterator[None]:
    """Apply ``F.dropout(h, p, training=True)`` to the outputs of the last ``last_layers`` blocks
    (found at the model entry's ``layers`` path, :func:`pwopsd.models.decoder_layers`).

    Hooks are always removed on exit (``try/finally``), also after an exception.
    """

    import torch.nn.functional as F

    def hook(module, inputs, output):
        if isinstance(output, tuple):
            return (F.dropout(output[0], p, training=True), *output[1:])
        return F.dropout(output, p, training=True)

    handles = [layer.register_forward_hook(hook) for layer in decoder_layers(model, layers)[-last_layers:]]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def last_hidden_states(model, ids: Sequence[int]) -> "torch.Tensor":
    """``[T, d]`` final hidden states of one sequence (the decoder only: no vocabulary projection)."""
    import torch

    x = torch.tensor([list(ids)], device=next(model.parameters()).device)
    inner = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    return inner(input_ids=x).last_hidden_state[0]


def teacher_pass(model, prompt_ids: Sequence[int], spine_ids: Sequence[int], *, top_k: int = 16,
                 chunk_size: int = 256) -> dict[str, np.ndarray]:
    """Phase B: the teacher's next-token distribution at every spine position, streamed.

    One forward over ``prompt + spine`` gives the hidden states; the vocabulary projection, the
    softmax, the full entropy and the top-``top_k`` tokens are computed ``chunk_size`` positions at
    a time, so full-vocabulary distributions never exist for the whole spine. Position ``t``
    predicts ``spine_ids[t]`` (from the hidden state of the token before it).
    """
    import torch

    with torch.no_grad():
        hidden = last_hidden_states(model, list(prompt_ids) + list(spine_ids))
        head = model.get_output_embeddings().weight
        start = len(prompt_ids) - 1
        entropies, top_ids, top_probs = [], [], []
        for a in range(start, start + len(spine_ids), chunk_size):
            h = hidden[a : min(a + chunk_size, start + len(spine_ids))]
            logp = torch.log_softmax((h @ head.T).float(), dim=-1)
            entropies.append(-(logp.exp() * logp).sum(-1))
            vals, idx = logp.topk(top_k, dim=-1)
            top_ids.append(idx)
            top_probs.append(vals.exp())
        return {"entropy": torch.cat(entropies).cpu().numpy(), "top_ids": torch.cat(top_ids).cpu().numpy(),
                "top_probs": torch.cat(top_probs).cpu().numpy()}


def forced_continuation_requests(student_prompt_ids: Sequence[int], spine_ids: Sequence[int], position: int,
                                 children: Sequence[int], *, n: int = 6, seed: int = 0, seed_stride: int | None = None,
                                 temperature: float = 1.0, top_p: float = 0.95, max_model_len: int = 32768,
                                 max_new_tokens: int | None = None):
    """Phase E: one request per forced child: student prompt + spine up to ``position`` + child,
    ``n`` continuations at T=1.0/top_p 0.95, new tokens clipped to fit ``max_model_len`` (and at most
    ``max_new_tokens``, beyond the paper, where given).

    Child ``j`` gets request seed ``seed + j * seed_stride`` (default stride ``n``: the children's
    samples, seeds ``s + k`` in vLLM's convention, never share a seed)."""
    from pwopsd.generation.sampling import SamplingConfig

    stride = n if seed_stride is None else seed_stride
    reqs = []
    for j, child in enumerate(children):
        prefix = list(student_prompt_ids) + list(spine_ids[:position]) + [int(child)]
        sampling = SamplingConfig(n=n, temperature=temperature, top_p=top_p, top_k=0,
                                  max_new_tokens=int(max_new_tokens or max_model_len),
                                  max_model_len=max_model_len, seed=seed + stride * j)
        reqs.append(sampling.request(prefix))
    return reqs
