"""Rollout engines for on-policy training: the student's samples, from its current weights.

A training step asks its rollout engine to :meth:`sync` to the policy being trained (the PEFT
model after the previous optimizer step), then to :meth:`generate` the step's rollouts.

Two settings decide it. ``training.rollout_backend`` is the engine:

- ``hf``: the ``hf`` backend in the training process;
- ``vllm``: a colocated vLLM engine built once per training process, in a process of its own that
  sees only the rank's GPU (:class:`~pwopsd.generation.vllm_backend.VLLMBackend`
  ``engine_devices``), apart from the trainer's ``torch.distributed`` state.

``training.rollout_policy`` is what the engine samples (:data:`ROLLOUT_POLICIES`):

- ``adapter``: base + the current LoRA, exactly the trained policy. ``hf`` samples the live PEFT
  model (nothing to sync); ``vllm`` gets the adapter saved to ``<sync_dir>/step-XXXXXX`` (the LoRA
  matrices only, a few MB) and passed with every request as a LoRA request under a **new adapter
  id** each step (:meth:`~pwopsd.generation.vllm_backend.VLLMBackend.use_adapter`). vLLM's
  prefix-cache block hashes include the adapter's name, which carries the id, so a step never reuses
  KV blocks computed with older weights, and a known id with a new path (which vLLM would serve with
  the old weights) never occurs.
- ``merged_bf16``: the reference's policy. Its trainer merges the LoRA into the **bf16** base
  weights before loading them into vLLM (:func:`bf16_merged_weight`), so every weight change smaller
  than half a bf16 step of the base weight is rounded away and the rollouts lag the trained policy.
  ``hf`` samples a second model holding those merged weights; ``vllm`` rewrites the weights of its
  engine's model folder (``<sync_dir>/policy``, the base checkpoint's other files linked) and
  reloads them, resetting the prefix cache.

Per-request seeds come from (seed, step, problem) in the training loop, so a resumed run repeats
its rollouts on either engine and either policy.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Sequence

from pwopsd.generation import Completion, GenerationRequest
from pwopsd.io import atomic_path
from pwopsd.models import WEIGHT_FILES  # the merged policy's folder has its own

ROLLOUT_POLICIES = ("adapter", "merged_bf16")


def bf16_merged_weight(weight, lora_a, lora_b, scaling: float):
    """A LoRA layer's weight merged as the reference's vLLM sync merges it: every tensor in bf16
    (DeepSpeed's bf16 module copies), the update ``B @ A * scaling`` rounded to bf16 once and added
    to the bf16 base weight in bf16 (PEFT's ``merge_adapter``). An update element smaller than half
    a bf16 step of its base element is lost."""
    import torch

    bf16 = torch.bfloat16
    delta = (lora_b.detach().to(bf16).float() @ lora_a.detach().to(bf16).float()) * scaling
    return weight.detach().to(bf16) + delta.to(bf16)


def merged_bf16_state_dict(peft_model, device: str | None = "cpu") -> dict:
    """The weights of the ``merged_bf16`` rollout policy, named as in the base checkpoint (tied
    weights once): every LoRA layer of the active adapter merged by :func:`bf16_merged_weight`,
    every other weight cast to bf16. ``device=None`` keeps each tensor where the model holds it."""
    import torch
    from peft.tuners.lora import LoraLayer

    inner = peft_model.get_base_model()
    name = peft_model.active_adapter
    merged = {f"{path}.weight": bf16_merged_weight(m.base_layer.weight, m.lora_A[name].weight, m.lora_B[name].weight,
                                                   m.scaling[name])
              for path, m in inner.named_modules() if isinstance(m, LoraLayer) and name in m.lora_A}
    out = {}
    with torch.no_grad():
        for path, param in inner.named_parameters():  # tied weights appear once
            if ".lora_" in path:
                continue
            key = path.replace(".base_layer.", ".")
            value = merged.pop(key, None)
            value = param.detach().to(torch.bfloat16) if value is None else value
            out[key] = value if device is None else value.to(device).contiguous()
    if merged:
        raise RuntimeError(f"merged LoRA weights without a base weight of that name: {sorted(merged)[:3]}")
    return out


def _load_policy_weights(model, weights: dict) -> None:
    """Copy ``weights`` (:func:`merged_bf16_state_dict`) into a plain model of the base's
    architecture; only tied weights may be absent."""
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        raise RuntimeError(f"merged policy weights do not fit the model: missing {sorted(set(missing) - tied)[:3]}, "
                           f"unexpected {sorted(unexpected)[:3]}")


def check_policy(policy: str) -> str:
    if policy not in ROLLOUT_POLICIES:
        raise ValueError(f"training.rollout_policy: unknown rollout policy {policy!r} ({' or '.join(ROLLOUT_POLICIES)})")
    return policy


class HFRollouts:
    """Rollouts with the ``hf`` backend: from the live (PEFT) model ``model`` (``adapter``), or from
    a second model holding the merged bf16 weights, refreshed at every :meth:`sync` (``merged_bf16``)."""

    name = "hf"

    def __init__(self, model, tokenizer, *, batch_size: int, policy: str = "adapter"):
        self.model, self.tokenizer, self.batch_size = model, tokenizer, int(batch_size)
        self.policy = check_policy(policy)
        self.policy_model = None

    def sync(self, peft_model, step: int) -> float:
        """``adapter``: nothing to do, the rollouts run on the trained model itself. ``merged_bf16``:
        merge the current adapter into the policy model's weights. Returns the seconds spent."""
        if self.policy == "adapter":
            return 0.0
        from transformers import AutoModelForCausalLM

        t0 = time.perf_counter()
        inner = peft_model.get_base_model()
        if self.policy_model is None:  # once: a plain model of the base's architecture, dtype and device
            dtype = next(inner.parameters()).dtype
            self.policy_model = AutoModelForCausalLM.from_config(inner.config, dtype=dtype).to(inner.device).eval()
        _load_policy_weights(self.policy_model, merged_bf16_state_dict(peft_model, device=None))
        return time.perf_counter() - t0

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        from pwopsd.generation.hf_backend import HFBackend

        model = self.policy_model if self.policy == "merged_bf16" else self.model
        if model is None:
            raise RuntimeError("merged_bf16 rollouts before the first sync")
        was_training = model.training
        model.eval()
        try:
            return HFBackend(model, self.tokenizer, batch_size=self.batch_size).generate(requests)
        finally:
            model.train(was_training)

    def close(self) -> None:
        pass


def policy_folder(base_path: str | Path, folder: str | Path) -> Path:
    """The ``merged_bf16`` engine's model folder: the base checkpoint's files other than weights
    (config, tokenizer, generation config) linked; the weights are written by each sync."""
    base, folder = Path(base_path).resolve(), Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for f in base.iterdir():
        if f.is_file() and not any(f.match(p) for p in WEIGHT_FILES) and not (folder / f.name).exists():
            (folder / f.name).symlink_to(f)
    return folder


# How far an engine's log-probs of the probe may lie from the trainer's own (its other kernels; the
# bf16 rounding of a merge): a few dozen of the policy weights' unit roundoffs (bf16: 2^-8, a merged
# policy's weights are bf16 whatever the compute dtype), none for a wrong or stale model.
PROBE_TOLERANCE = {"bfloat16": 64 * 2.0**-8, "float16": 64 * 2.0**-11, "float32": 2.0**-10}
# A sentence of the training task's kind, tokenized with the run's tokenizer: the probe sequence.
PROBE_TEXT = "Question: what is 12 + 30? Answer: we add the tens, 10 + 30 = 40, then the ones: 40 + 2 = 42. So 42."


class StaleEngineError(RuntimeError):
    """The rollout engine does not serve the policy the trainer synced to it."""


_MIX1, _MIX2 = 0x9E3779B97F4A7C15 - (1 << 64), 0x632BE59BD9B4E019  # odd constants, as int64


def weights_fingerprint(tensors) -> int:
    """An exact fingerprint of tensors' bits that does not depend on their order or on how they
    are split or concatenated: the sum, modulo 2^64, of a nonlinear function of each element's bit
    pattern (so a weight one bf16 step up and another one step down do not cancel)."""
    import torch

    views = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    total = 0
    for t in tensors:
        bits = t.detach().contiguous().view(views[t.element_size()]).flatten()
        for chunk in bits.split(1 << 24):  # bounded temporaries on any device (an 8B model's tensors on its GPU)
            v = chunk.to(torch.int64)
            total += int((v * _MIX1 + (v * v) * _MIX2).sum())  # int64 products and sums wrap: exact modulo 2^64
    return total % (1 << 64)


def policy_logprobs(peft_model, token_ids) -> list[float]:
    """The trainer's log-probability of each token of ``token_ids`` after the ones before it."""
    import torch

    was_training = peft_model.training
    peft_model.eval()
    try:
        with torch.no_grad():
            device = next(peft_model.parameters()).device
            logits = peft_model(input_ids=torch.tensor([list(token_ids)], device=device)).logits[0, :-1].float()
            logp = torch.log_softmax(logits, dim=-1)
            return logp.gather(1, torch.tensor(token_ids[1:], device=device)[:, None])[:, 0].tolist()
    finally:
        peft_model.train(was_training)


class EngineProbe:
    """The runtime invariant of a rollout engine (issue 52): after each sync, the engine's
    log-probs of a fixed probe sequence lie within the dtype's tolerance of the trainer's own (on
    average over its tokens), and
    when the synced weights changed (their exact fingerprint), the engine's log-probs changed too.
    The second catches an engine that never reloads even at the paper's learning rate, where a
    step moves a weight by less than the tolerance; the first a wrong or mangled model."""

    def __init__(self, token_ids, dtype: str):
        self.ids = [int(t) for t in token_ids]
        self.tolerance = PROBE_TOLERANCE[dtype]
        self.last: tuple[int, list[float], int] | None = None  # (fingerprint, engine log-probs, step)
        self.max_difference = 0.0       # the largest difference of one token, over the checks
        self.max_mean_difference = 0.0  # the largest mean difference of a check

    def check(self, step: int, fingerprint: int, engine: list[float], trainer: list[float]) -> None:
        """The tolerance bounds the mean difference over the probe's tokens: a bf16 merge rounds
        each weight the LoRA delta moved, and on SmolLM2 that alone (both through HF, no vLLM) put
        one token of 40 0.22 away (mean 0.05) once the delta passed a weight's rounding step,
        whatever its size (|delta W| from 2e-4 to 7e-3); a wrong or mangled model moves most tokens."""
        diffs = [abs(a - b) for a, b in zip(engine, trainer, strict=True)]
        largest, mean = max(diffs), sum(diffs) / len(diffs)
        self.max_difference = max(self.max_difference, largest)
        self.max_mean_difference = max(self.max_mean_difference, mean)
        if self.last is not None and fingerprint != self.last[0] and engine == self.last[1]:
            raise StaleEngineError(
                f"step {step}: the synced policy's weights changed since step {self.last[2]}, but the rollout engine's "
                f"log-probs of the probe are bit for bit the same: it still serves the old weights (its reload or "
                f"adapter switch did not take)")
        if mean > self.tolerance:
            raise StaleEngineError(
                f"step {step}: the rollout engine's log-probs of the probe differ from the trainer's by {mean:.3g} on "
                f"average, up to {largest:.3g} (tolerance {self.tolerance:.3g} on the average): it does not serve the "
                f"trained policy")
        self.last = (fingerprint, engine, step)


class VLLMRollouts:
    """Rollouts from a colocated vLLM engine (``backend``). ``adapter``: the engine (built with
    ``max_lora_rank``) runs the current LoRA adapter, saved under ``sync_dir`` at every :meth:`sync`.
    ``merged_bf16``: the engine's model folder is ``sync_dir/policy`` (:func:`policy_folder`), whose
    weights every :meth:`sync` rewrites with the merged bf16 policy before the engine reloads them."""

    name = "vllm"

    def __init__(self, backend, sync_dir: str | Path, *, policy: str = "adapter", probe: EngineProbe | None = None):
        self.backend = backend
        self.sync_dir = Path(sync_dir)
        self.sync_dir.mkdir(parents=True, exist_ok=True)
        self.policy = check_policy(policy)
        self.probe = probe
        self._current: Path | None = None
        self.phases: dict[str, float] = {}

    def sync(self, peft_model, step: int) -> float:
        """Feed the engine the current policy; returns the seconds spent, and keeps each part's in
        :attr:`phases`, which the step log records as ``sync_<part>`` (the cost plan's
        ``merged_sync_s_per_b_params`` is priced from them): ``merge_seconds`` (``merged_bf16``),
        ``write_seconds`` (and the ``bytes`` written), ``engine_seconds`` (the engine reloads the
        weights, which it does on its next call, and computes the probe's log-probs) and
        ``check_seconds`` (the trainer's log-probs and the comparison); without the
        check (``training.rollout_check: false``) the reload falls into the step's rollouts.
        ``adapter``: save the adapter and point the engine at it under a new adapter id (the
        previous step's folder is removed: the engine holds the weights it loaded).
        ``merged_bf16``: write the merged weights into the engine's model folder and have the
        engine reload them (prefix cache reset)."""
        t0 = time.perf_counter()
        phases: dict[str, float] = {}
        if self.policy == "merged_bf16":
            from safetensors.torch import save_file

            weights = merged_bf16_state_dict(peft_model, device=None)  # where the model is: fingerprinted there
            fingerprint = weights_fingerprint(weights.values()) if self.probe is not None else None
            phases["merge_seconds"] = time.perf_counter() - t0
            target = self.sync_dir / "policy" / "model.safetensors"
            with atomic_path(target) as tmp:
                save_file({k: v.to("cpu").contiguous() for k, v in weights.items()}, str(tmp),
                          metadata={"format": "pt", "step": str(step)})
            phases["write_seconds"] = time.perf_counter() - t0 - phases["merge_seconds"]
            phases["bytes"] = float(target.stat().st_size)
            self.backend.reload_weights()  # on the engine's next call
        else:
            path = self.sync_dir / f"step-{step:06d}"
            with atomic_path(path) as tmp:
                peft_model.save_pretrained(tmp)
            phases["write_seconds"] = time.perf_counter() - t0
            self.backend.use_adapter(path)
            if self._current is not None and self._current != path:
                shutil.rmtree(self._current, ignore_errors=True)
            self._current = path
            lora = [p for n, p in peft_model.named_parameters() if ".lora_" in n]
            fingerprint = weights_fingerprint(lora) if self.probe is not None else None
        if self.probe is not None:
            t1 = time.perf_counter()
            served = self.backend.probe(self.probe.ids)
            phases["engine_seconds"] = time.perf_counter() - t1
            self.probe.check(step, fingerprint, served, policy_logprobs(peft_model, self.probe.ids))
            phases["check_seconds"] = time.perf_counter() - t1 - phases["engine_seconds"]
        self.phases = phases
        return time.perf_counter() - t0

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        return self.backend.generate(requests)

    def close(self) -> None:
        self.backend.close()


def make_rollouts(backend: str, *, model, tokenizer, batch_size: int, model_path: str, dtype: str, lora_rank: int,
                  engine: dict, sync_dir: str | Path, local_rank: int = 0, policy: str = "adapter"):
    """The rollout engine of one training process (``training.rollout_backend``) sampling the
    ``policy`` (``training.rollout_policy``): ``hf`` on the live model, or ``vllm`` with ``engine``
    settings (the model's ``vllm`` entry: the training memory fraction, CPU KV cache, chunked
    prefill, in-process core) on the rank's device."""
    check_policy(policy)
    if backend == "hf":
        return HFRollouts(model, tokenizer, batch_size=batch_size, policy=policy)
    if backend != "vllm":
        raise ValueError(f"training.rollout_backend: unknown rollout backend {backend!r} (hf or vllm)")
    import torch

    from pwopsd.accelerator import rank_device
    from pwopsd.generation.sampling import make_backend

    # the rank's own GPU, its entry of the job's CUDA_VISIBLE_DEVICES (on CPU: none)
    devices = rank_device(local_rank) if torch.cuda.is_available() else ""
    if policy == "merged_bf16":  # the engine serves its own folder's weights, no adapters
        path, lora = str(policy_folder(model_path, Path(sync_dir) / "policy")), None
    else:
        path, lora = model_path, lora_rank
    # The context of a rollout (prompt and completion: training.rollout_max_model_len), not the
    # model's own (131,072 tokens for Llama 3.1, whose KV cache does not fit the training share).
    options = {k: v for k, v in engine.items() if k not in ("max_model_len", "check")}
    vllm = make_backend("vllm", {"path": path}, dtype=dtype, max_model_len=engine.get("max_model_len"),
                        options={**options, "tensor_parallel_size": 1, "max_lora_rank": lora, "engine_devices": devices})
    probe = None
    if engine.get("check", True):  # training.rollout_check
        if tokenizer is None:
            raise ValueError("the rollout engine's check (training.rollout_check) needs the run's tokenizer")
        ids = tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]
        probe = EngineProbe(ids, "bfloat16" if policy == "merged_bf16" else dtype)
    return VLLMRollouts(vllm, sync_dir, policy=policy, probe=probe)
