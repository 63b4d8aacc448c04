"""Hugging Face transformers backend: batched sampling with a KV cache on CPU or one GPU.

It runs its own decode loop rather than ``model.generate`` so that every sample has its own
``torch.Generator`` (seed ``request.sample_seed(j)``: its base seed plus ``j``, the vLLM
convention; :mod:`pwopsd.generation`). A sample's tokens then
depend only on its prompt, its seed and the model, not on which other prompts share its batch.

Efficiency: rows are sorted by prompt length to keep left padding small, the samples of one prompt
share one prefill (its KV cache is repeated for them), logits are computed for the last position
only, rows that finish are dropped from the batch and its KV cache, and with tiny mode's exact
products each weight is rounded once a call (:func:`pwopsd.exact_matmul.reuse_weights`).
"""

from __future__ import annotations

import logging
from typing import Sequence

import torch

from pwopsd import exact_matmul
from pwopsd.generation import FINISH_LENGTH, FINISH_STOP, Completion, GenerationRequest

log = logging.getLogger(__name__)


# The most likely tokens sorted per row before sampling: a row whose nucleus lies within them
# (nearly every row of a trained model) needs no sort of the whole vocabulary.
SAMPLING_WINDOW = 64


def filter_and_sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    top_k: torch.Tensor,
    uniforms: torch.Tensor,
    window: int = SAMPLING_WINDOW,
) -> torch.Tensor:
    """Sample one token per row from ``logits`` ``[B, V]`` with per-row settings.

    Rows with ``temperature == 0`` take the argmax. Others are scaled by their temperature, cut to
    the ``top_k`` most likely tokens (``top_k <= 0``: no cut), then to the smallest set whose
    probability reaches ``top_p`` (the most likely token is always kept), renormalized, and
    sampled by inverse CDF with the row's uniform draw ``uniforms[b]`` in ``[0, 1)``.

    Only the ``window`` most likely tokens of a row are sorted when its top-k cut or its nucleus
    lies within them; other rows sort their whole vocabulary. Both give the same token: a row's
    probabilities are ``exp(logit - logsumexp)`` over its top-k set either way, and the tokens
    beyond the nucleus never enter its CDF.
    """
    logits = logits.float()
    rows, vocab = logits.shape
    greedy = temperature <= 0
    safe_t = torch.where(greedy, torch.ones_like(temperature), temperature)
    scaled = logits / safe_t[:, None]
    k = torch.where((top_k > 0) & (top_k < vocab), top_k, torch.full_like(top_k, vocab))
    width = min(vocab, int(window))
    lse_all = torch.logsumexp(scaled, dim=-1)  # the top-k set of a row without a cut: the whole vocabulary
    vals, idx = torch.topk(scaled, width, dim=-1) if width < vocab else torch.sort(scaled, dim=-1, descending=True)
    choice, mass = _nucleus_choice(vals, k, vocab, lse_all, top_p, uniforms)
    # A row is done when its top-k set, or its nucleus, lies within the window.
    done = (k <= width) | ((k == vocab) & (mass >= top_p))
    tokens = idx.gather(-1, choice[:, None]).squeeze(-1)
    if not bool(done.all()):
        rest = (~done).nonzero().squeeze(-1)
        full_vals, full_idx = torch.sort(scaled[rest], dim=-1, descending=True)
        rest_choice, _ = _nucleus_choice(full_vals, k[rest], vocab, lse_all[rest], top_p[rest], uniforms[rest])
        tokens[rest] = full_idx.gather(-1, rest_choice[:, None]).squeeze(-1)
    return torch.where(greedy, logits.argmax(dim=-1), tokens)


def _nucleus_choice(vals: torch.Tensor, k: torch.Tensor, vocab: int, lse_all: torch.Tensor, top_p: torch.Tensor,
                    uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampled rank within ``vals`` (a row's most likely scaled logits, sorted descending) and
    the probability mass ``vals`` hold, for rows with top-k cut ``k`` (the vocabulary size: none)."""
    width = vals.shape[-1]
    ranks = torch.arange(width, device=vals.device)[None, :]
    cut = vals.masked_fill(ranks >= k[:, None], float("-inf"))
    # log-normalizer over the row's top-k set: the whole vocabulary's for a row without a cut (the
    # same number whichever of its tokens vals holds), else its top k, which vals then holds
    lse = torch.where(k < vocab, torch.logsumexp(cut, dim=-1), lse_all)
    probs = torch.exp(cut - lse[:, None])
    cum = probs.cumsum(dim=-1)
    # Drop a token when the mass strictly before it already reaches top_p.
    drop = (cum - probs) >= top_p[:, None]
    drop[:, 0] = False
    kept = probs.masked_fill(drop, 0.0)
    cdf = kept.cumsum(dim=-1)
    target = uniforms[:, None].to(cdf.dtype) * cdf[:, -1:]
    choice = torch.searchsorted(cdf, target, right=True).clamp_(max=width - 1)
    return choice.squeeze(-1), cum[:, -1]


class HFBackend:
    name = "hf"
    unseeded_reproducible = True  # seed=None draws with default_seed, like any seed

    def __init__(
        self,
        model,
        tokenizer,
        *,
        batch_size: int = 64,
        default_seed: int = 0,
        eos_ids: Sequence[int] | None = None,
        progress: bool = False,
        share_prefill: bool = True,
    ):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size = int(batch_size)
        self.default_seed = int(default_seed)
        self.device = next(model.parameters()).device
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.eos_ids = tuple(sorted(set(eos_ids if eos_ids is not None else default_eos_ids(model, tokenizer))))
        self.progress = progress
        self.share_prefill = bool(share_prefill)  # False: every sample runs its own prefill (benchmarks)
        self.tokens_generated = 0

    def close(self) -> None:
        """Nothing to release: the model lives as long as the job holds the backend."""

    def __enter__(self) -> "HFBackend":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def versions(self) -> dict[str, str]:
        import transformers

        return {"backend": "hf", "torch": torch.__version__, "transformers": transformers.__version__}

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        rows = [(i, j) for i, req in enumerate(requests) for j in range(req.n)]
        # Longest prompts first, so each batch has similar lengths (little padding).
        rows.sort(key=lambda r: (-len(requests[r[0]].prompt_ids), r))
        out: list[list[Completion | None]] = [[None] * req.n for req in requests]
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(rows), desc="generate", unit="sample", mininterval=5)
        # The weights do not change during the call: with tiny mode's exact products, each is rounded once.
        with exact_matmul.reuse_weights():
            for start in range(0, len(rows), self.batch_size):
                chunk = rows[start : start + self.batch_size]
                for (i, j), completion in zip(chunk, self._generate_batch([(requests[i], j) for i, j in chunk])):
                    out[i][j] = completion
                if bar is not None:
                    bar.update(len(chunk))
        if bar is not None:
            bar.close()
        return out  # type: ignore[return-value]

    @torch.inference_mode()
    def _generate_batch(self, items: list[tuple[GenerationRequest, int]]) -> list[Completion]:
        dev = self.device
        b = len(items)
        # Samples of one prompt share its prefill: each distinct prompt is run once, and its KV
        # cache and last logits are repeated for its rows (the n samples of a request).
        rows = [req.prompt_ids for req, _ in items]
        prompt_of, distinct = shared_prompts(rows) if self.share_prefill else (list(range(b)), [tuple(p) for p in rows])
        plen = max(len(p) for p in distinct)
        ids = torch.full((len(distinct), plen), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(distinct), plen), dtype=torch.long)
        for r, prompt in enumerate(distinct):
            ids[r, plen - len(prompt) :] = torch.tensor(prompt)
            attn[r, plen - len(prompt) :] = 1
        ids, attn = ids.to(dev), attn.to(dev)
        pos = (attn.cumsum(-1) - 1).clamp_(min=0)
        expand = torch.tensor(prompt_of, device=dev)

        temperature = torch.tensor([req.temperature for req, _ in items], device=dev)
        top_p = torch.tensor([req.top_p for req, _ in items], device=dev)
        top_k = torch.tensor([req.top_k for req, _ in items], device=dev)
        max_new = [req.max_new_tokens for req, _ in items]
        stops = [set(self.eos_ids) | set(req.stop_ids) for req, _ in items]
        # Each sample's uniform draws, one per token, from its own generator: drawn all at once
        # (the same numbers, in order, as one draw per step).
        uniforms_all = torch.empty((b, max(max_new)), dtype=torch.float32)
        for r, (req, j) in enumerate(items):
            g = torch.Generator(device="cpu")
            g.manual_seed(req.sample_seed(j, self.default_seed))
            uniforms_all[r, : max_new[r]] = torch.rand(max_new[r], generator=g)

        generated: list[list[int]] = [[] for _ in range(b)]
        finish: list[str | None] = [None] * b
        alive = list(range(b))  # original row index of each row still in the batch
        cache = None
        step_ids, step_attn, step_pos = ids, attn, pos
        step = 0
        while alive:
            outputs = self.model(
                input_ids=step_ids,
                attention_mask=step_attn,
                position_ids=step_pos,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            cache = outputs.past_key_values
            logits = outputs.logits[:, -1, :]
            if step == 0:  # the prefill: one row per distinct prompt, repeated for its samples
                cache.batch_select_indices(expand)
                logits, attn, step_pos = logits.index_select(0, expand), attn.index_select(0, expand), step_pos.index_select(0, expand)
            sel = torch.tensor(alive, device=dev)
            uniforms = uniforms_all[sel.cpu(), step].to(dev)
            tokens = filter_and_sample(logits, temperature[sel], top_p[sel], top_k[sel], uniforms).tolist()
            step += 1
            keep = []
            for slot, (r, tok) in enumerate(zip(alive, tokens)):
                generated[r].append(tok)
                if tok in stops[r]:
                    finish[r] = FINISH_STOP
                elif len(generated[r]) >= max_new[r]:
                    finish[r] = FINISH_LENGTH
                else:
                    keep.append(slot)
            self.tokens_generated += len(tokens)
            if not keep:
                break
            last_tok = torch.tensor(tokens, device=dev)[:, None]
            last_pos = step_pos[:, -1:] + 1
            if len(keep) < len(alive):
                idx = torch.tensor(keep, device=dev)
                cache.batch_select_indices(idx)
                attn = attn.index_select(0, idx)
                last_tok, last_pos = last_tok.index_select(0, idx), last_pos.index_select(0, idx)
                alive = [alive[s] for s in keep]
            attn = torch.cat([attn, torch.ones((len(alive), 1), dtype=attn.dtype, device=dev)], dim=1)
            step_ids, step_attn, step_pos = last_tok, attn, last_pos

        return [
            Completion(
                token_ids=generated[r],
                text=self.tokenizer.decode(generated[r], skip_special_tokens=True),
                finish_reason=finish[r] or FINISH_LENGTH,
            )
            for r in range(b)
        ]


def shared_prompts(prompts: Sequence[Sequence[int]]) -> tuple[list[int], list[tuple[int, ...]]]:
    """For each row, the index of its prompt among the distinct prompts (in order of first
    appearance), and those distinct prompts."""
    index: dict[tuple[int, ...], int] = {}
    rows = [index.setdefault(tuple(p), len(index)) for p in prompts]
    return rows, list(index)


def default_eos_ids(model, tokenizer) -> list[int]:
    """EOS ids from the tokenizer and the model's generation config (which may list several)."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_cfg = getattr(model, "generation_config", None)
    eos = getattr(gen_cfg, "eos_token_id", None) if gen_cfg is not None else None
    if isinstance(eos, int):
        ids.add(eos)
    elif eos:
        ids.update(int(e) for e in eos)
    return sorted(ids)
