"""Rollout engines for on-policy training: the student's samples, from its current weights.

A training step asks its rollout engine to :meth:`sync` to the policy being trained (the PEFT
model after the previous optimizer step), then to :meth:`generate` the step's rollouts
(``training.rollout_backend``):

- ``hf``: the live PEFT model in the training process, sampled by the ``hf`` backend; nothing to
  sync (exactly on-policy).
- ``vllm``: a colocated vLLM engine built once per training process, fed the current LoRA adapter
  before every rollout batch. The adapter is saved to ``<sync_dir>/step-XXXXXX`` (a few MB: the
  LoRA matrices only) and passed with every request as a LoRA request under a **new adapter id**
  each step (:meth:`pwopsd.generation.vllm_backend.VLLMBackend.use_adapter`). vLLM's prefix-cache
  block hashes include the adapter's name, which carries the id, so a step never reuses KV blocks
  computed with older weights, and a known id with a new path (which vLLM would serve with the old
  weights) never occurs. This is as on-policy as ``hf``: rollouts come from base + current LoRA,
  in the engine's dtype. The engine runs in a process of its own that sees only the rank's GPU
  (:class:`~pwopsd.generation.vllm_backend.VLLMBackend` ``engine_devices``), apart from the
  trainer's ``torch.distributed`` state.

Per-request seeds come from (seed, step, problem) in the training loop, so a resumed run repeats
its rollouts on either engine.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Sequence

from pwopsd.generation import Completion, GenerationRequest
from pwopsd.io import atomic_path


class HFRollouts:
    """Rollouts from the live (PEFT) model with the ``hf`` backend."""

    name = "hf"

    def __init__(self, model, tokenizer, *, batch_size: int):
        self.model, self.tokenizer, self.batch_size = model, tokenizer, int(batch_size)

    def sync(self, peft_model, step: int) -> float:
        """Nothing to do: the rollouts run on the trained model itself. Returns the seconds spent (0)."""
        return 0.0

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        from pwopsd.generation.hf_backend import HFBackend

        was_training = self.model.training
        self.model.eval()
        try:
            return HFBackend(self.model, self.tokenizer, batch_size=self.batch_size).generate(requests)
        finally:
            self.model.train(was_training)

    def close(self) -> None:
        pass


class VLLMRollouts:
    """Rollouts from a colocated vLLM engine (``backend``, built with ``max_lora_rank``) that runs
    the current LoRA adapter, saved under ``sync_dir`` at every :meth:`sync`."""

    name = "vllm"

    def __init__(self, backend, sync_dir: str | Path):
        self.backend = backend
        self.sync_dir = Path(sync_dir)
        self.sync_dir.mkdir(parents=True, exist_ok=True)
        self._current: Path | None = None

    def sync(self, peft_model, step: int) -> float:
        """Save the policy's adapter and point the engine at it (a new adapter id); the previous
        step's folder is removed (the engine holds the weights it loaded). Returns the seconds spent."""
        t0 = time.perf_counter()
        path = self.sync_dir / f"step-{step:06d}"
        with atomic_path(path) as tmp:
            peft_model.save_pretrained(tmp)
        self.backend.use_adapter(path)
        if self._current is not None and self._current != path:
            shutil.rmtree(self._current, ignore_errors=True)
        self._current = path
        return time.perf_counter() - t0

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        return self.backend.generate(requests)

    def close(self) -> None:
        self.backend.close()


def make_rollouts(backend: str, *, model, tokenizer, batch_size: int, model_path: str, dtype: str, lora_rank: int,
                  engine: dict, sync_dir: str | Path, local_rank: int = 0):
    """The rollout engine of one training process (``training.rollout_backend``): ``hf`` on the
    live model, or ``vllm`` with ``engine`` settings (the model's ``vllm`` entry: the training
    memory fraction, CPU KV cache, chunked prefill, in-process core) on the rank's device."""
    if backend == "hf":
        return HFRollouts(model, tokenizer, batch_size=batch_size)
    if backend != "vllm":
        raise ValueError(f"training.rollout_backend: unknown rollout backend {backend!r} (hf or vllm)")
    import torch

    from pwopsd.generation.sampling import make_backend

    devices = str(local_rank) if torch.cuda.is_available() else ""  # the rank's own GPU (on CPU: none)
    vllm = make_backend("vllm", {"path": model_path}, dtype=dtype, max_model_len=None,
                        options={**engine, "tensor_parallel_size": 1, "max_lora_rank": lora_rank, "engine_devices": devices})
    return VLLMRollouts(vllm, sync_dir)
