"""vLLM backend (GPU only): ``vllm.LLM`` + per-request ``SamplingParams``, imported lazily.

Tensor parallelism runs inside one engine. Offline ``LLM(data_parallel_size>1)`` is refused by
recent vLLM, so data parallelism here means ``data_parallel_size`` independent engine processes,
each pinned to its own ``tensor_parallel_size`` GPUs through ``CUDA_VISIBLE_DEVICES`` and given a
round-robin share of the requests. Per-request seeds make every sample independent of which
engine served it.

Everything except the engine calls is a pure function tested on CPU.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from typing import Any, Sequence

from . import Completion, GenerationRequest


def sampling_params_kwargs(req: GenerationRequest, *, min_p: float = 0.0) -> dict[str, Any]:
    """``vllm.SamplingParams`` keyword arguments for one request.

    top_k disabled is passed as -1 (accepted by every vLLM release; 0 was rejected before 0.9).
    ``seed=None`` is left out so the engine seed applies (the paper's "main" run).
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
        kwargs["seed"] = int(req.seed)
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


class VLLMBackend:
    name = "vllm"

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
        min_p: float = 0.0,
    ):
        self.engine_kwargs = {
            "model": model_path,
            "dtype": dtype,
            "max_model_len": max_model_len,
            "tensor_parallel_size": tensor_parallel_size,
            "gpu_memory_utilization": gpu_memory_utilization,
            "enforce_eager": enforce_eager,
            "seed": engine_seed,
            "trust_remote_code": False,
        }
        self.data_parallel_size = data_parallel_size
        self.min_p = min_p

    def versions(self) -> dict[str, str]:
        import vllm

        return {"backend": "vllm", "vllm": vllm.__version__}

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        if self.data_parallel_size == 1:
            return _run_engine(self.engine_kwargs, list(requests), self.min_p)
        import multiprocessing as mp

        shards = round_robin(len(requests), self.data_parallel_size)
        groups = gpu_groups(self.data_parallel_size, self.engine_kwargs["tensor_parallel_size"])
        ctx = mp.get_context("spawn")
        with tempfile.TemporaryDirectory(prefix="pwopsd-vllm-dp-") as tmp:
            procs = []
            for rank, (idx, gpus) in enumerate(zip(shards, groups)):
                out = os.path.join(tmp, f"rank{rank}.pkl")
                p = ctx.Process(target=_dp_worker, args=(self.engine_kwargs, [requests[i] for i in idx], self.min_p, gpus, out))
                p.start()
                procs.append((p, out))
            for p, _ in procs:
                p.join()
            failed = [r for r, (p, _) in enumerate(procs) if p.exitcode != 0]
            if failed:
                raise RuntimeError(f"vLLM data-parallel ranks {failed} failed (see their output above)")
            results: list[list[Completion]] = [[] for _ in requests]
            for idx, (_, out) in zip(shards, procs):
                with open(out, "rb") as fh:
                    for i, completions in zip(idx, pickle.load(fh)):
                        results[i] = completions
            return results


def _run_engine(engine_kwargs: dict, requests: list[GenerationRequest], min_p: float) -> list[list[Completion]]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(**{k: v for k, v in engine_kwargs.items() if v is not None})
    prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in requests]
    params = [SamplingParams(**sampling_params_kwargs(r, min_p=min_p)) for r in requests]
    outputs = llm.generate(prompts, params, use_tqdm=True)
    return [to_completions(o) for o in outputs]


def _dp_worker(engine_kwargs, requests, min_p, gpus, out_path):  # pragma: no cover - needs GPUs
    os.environ["CUDA_VISIBLE_DEVICES"] = gpus
    results = _run_engine(engine_kwargs, requests, min_p)
    with open(out_path, "wb") as fh:
        pickle.dump(results, fh)
