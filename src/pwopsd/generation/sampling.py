"""Sampling a model on a benchmark: prompts -> requests -> generations table, resumable.

A generation job at paper scale (7,080 samples of up to 38,912 tokens) runs for hours, so it works
through the benchmark in shards of problems. Each finished shard is saved under
``.<output>.partial/shards/<fingerprint>/`` (not a declared output; the fingerprint hashes everything
that determines the samples: the weights by content, dtype, backend and engine settings, the code,
sampling and prompts, :mod:`pwopsd.keys`), a restarted job skips finished shards, and the final parquet is written
atomically at the end.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from pwopsd import prompts
from pwopsd.generation import Backend, GenerationRequest
from pwopsd.io import clear_partial, partial_dir, write_parquet
from pwopsd.notice import stop_on_notice

log = logging.getLogger(__name__)


class PromptTooLongError(ValueError):
    pass


@dataclass(frozen=True)
class SamplingConfig:
    n: int
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    max_model_len: int
    seed: int | None
    min_p: float = 0.0

    @classmethod
    def from_evaluation(cls, evaluation: dict, seed: int | None) -> "SamplingConfig":
        return cls(
            n=int(evaluation["n"]),
            temperature=float(evaluation["temperature"]),
            top_p=float(evaluation["top_p"]),
            top_k=int(evaluation["top_k"]),
            max_new_tokens=int(evaluation["max_new_tokens"]),
            max_model_len=int(evaluation["max_model_len"]),
            seed=seed,
            min_p=float(evaluation.get("min_p", 0.0)),
        )

    def request(self, prompt_ids: Sequence[int]) -> GenerationRequest:
        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            raise PromptTooLongError(f"prompt of {len(prompt_ids)} tokens does not fit max_model_len={self.max_model_len}")
        return GenerationRequest(
            prompt_ids=tuple(int(t) for t in prompt_ids),
            n=self.n,
            seed=self.seed,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_new_tokens=min(self.max_new_tokens, room),
        )


def eval_prompt_ids(tokenizer, problems: Sequence[str], *, enable_thinking: bool, add_special_tokens: bool) -> list[list[int]]:
    """Token ids of the evaluation prompt for each problem (reference: no think-closure)."""
    style = prompts.PromptStyle("eval", enable_thinking=enable_thinking, think_closure=False)
    return [
        prompts.prompt_ids(tokenizer, prompts.eval_message(p), style, add_special_tokens=add_special_tokens)
        for p in problems
    ]


def generate_resumable(
    backend: Backend,
    requests: Sequence[GenerationRequest],
    keys: Sequence[dict[str, Any]],
    *,
    partial: Path,
    shard_size: int = 100,
    token_ids: bool = False,
    notice=None,
) -> pd.DataFrame:
    """Run ``requests`` in shards of ``shard_size`` requests; one row per completion.

    Row ``k`` of a request carries that request's ``keys`` columns, ``sample_index`` (``k``),
    ``text``, ``num_tokens``, ``finish_reason``, ``prompt_tokens`` (and ``token_ids`` when asked).
    Each finished shard is saved under ``partial`` and reused when the job is restarted; the
    caller names ``partial`` (:func:`partial_dir`) from everything that determines the samples.
    With a ``notice`` (:class:`pwopsd.notice.Notice`) that has received its signal, the
    shard in progress is finished and saved, and :class:`~pwopsd.notice.Interrupted` is
    raised before the next one: the job exits resumable and its rerun loses nothing.
    """
    if len(keys) != len(requests):
        raise ValueError(f"{len(keys)} key rows for {len(requests)} requests")
    partial.mkdir(parents=True, exist_ok=True)
    frames = []
    n_shards = (len(requests) + shard_size - 1) // shard_size
    t0 = time.time()
    for s in range(n_shards):
        shard_file = partial / f"shard-{s:05d}.parquet"
        if shard_file.exists():
            log.info("shard %d/%d already done, reusing %s", s + 1, n_shards, shard_file)
            frames.append(pd.read_parquet(shard_file))
            continue
        stop_on_notice(notice, f"{s} of {n_shards} shards saved in {partial}")  # before a shard, not after the last
        lo, hi = s * shard_size, min(len(requests), (s + 1) * shard_size)
        results = backend.generate(requests[lo:hi])
        rows = []
        for key, req, completions in zip(keys[lo:hi], requests[lo:hi], results):
            for j, c in enumerate(completions):
                row = {**key, "sample_index": j, "text": c.text, "num_tokens": len(c.token_ids),
                       "finish_reason": c.finish_reason, "prompt_tokens": len(req.prompt_ids)}
                if token_ids:
                    row["token_ids"] = list(c.token_ids)
                rows.append(row)
        frame = pd.DataFrame(rows)
        write_parquet(frame, shard_file)
        frames.append(frame)
        log.info("shard %d/%d: %d samples (%.1fs elapsed)", s + 1, n_shards, len(frame), time.time() - t0)
    if not frames:
        return pd.DataFrame(columns=[*(keys[0] if keys else {}), "sample_index", "text", "num_tokens", "finish_reason",
                                     "prompt_tokens"])
    return pd.concat(frames, ignore_index=True)


def sample_benchmark(
    backend: Backend,
    problem_ids: Sequence[str],
    prompt_ids: Sequence[Sequence[int]],
    sampling: SamplingConfig,
    *,
    output: str | Path,
    metadata: dict[str, Any],
    shard_size: int = 100,
    notice=None,
    clear: bool = True,
    identity: dict | None = None,
) -> pd.DataFrame:
    """Generate ``sampling.n`` samples per problem and write the generations parquet at ``output``
    (its shards are removed then, unless ``clear`` is False: a job with several outputs keeps them
    until all are written, since Snakemake deletes every output of a job that stops early).

    ``identity`` is what the kept shards are the work of besides sampling, prompts and
    ``metadata``: the model's weights by content, dtype, backend, engine settings and code
    (:func:`generation_identity`). Without it, shards are keyed by ``metadata`` alone."""
    t0 = time.time()
    requests = [sampling.request(p) for p in prompt_ids]
    key = {"identity": identity, "meta": {k: v for k, v in metadata.items() if k not in NOT_IN_SHARD_KEY},
           "sampling": sampling.__dict__, "ids": list(problem_ids), "prompts": [list(p) for p in prompt_ids]}
    table = generate_resumable(backend, requests, [{"problem_id": pid} for pid in problem_ids],
                               partial=partial_dir(output, key), shard_size=shard_size, notice=notice)
    meta = {**metadata, "sampling": sampling.__dict__, "backend": backend.versions(),
            "reproducible": sampling.seed is not None or backend.unseeded_reproducible,
            "seconds": round(time.time() - t0, 3)}
    write_parquet(table, output, metadata=meta)
    if clear:
        clear_partial(output)
    return table


def make_backend(name: str, manifest: dict, *, dtype: str, max_model_len: int | None, min_p: float = 0.0,
                 options: dict | None = None, tokenizer=None, progress: bool = True) -> Backend:
    """The configured generation backend for a checkpoint (``hf``: loaded here; ``vllm``: lazily).

    ``options`` are execution settings (``hf_batch_size``; for vLLM a model's ``vllm`` entry:
    ``tensor_parallel_size``, ``data_parallel_size``, ``gpu_memory_utilization``,
    ``enforce_eager``, ``kv_cache_memory_gib``, ``enable_chunked_prefill``, ``in_process``; and
    for a training rollout engine ``max_lora_rank`` and ``engine_devices``, see
    :func:`pwopsd.generation.rollout.make_rollouts`). ``max_model_len`` None: the model's own.
    """
    from pwopsd.generation import get_backend
    from pwopsd.models import default_device, load_model

    options = options or {}
    if name == "hf":
        model = load_model(manifest, device=default_device(), dtype=dtype)
        return get_backend("hf", model=model, tokenizer=tokenizer, batch_size=options.get("hf_batch_size", 64), progress=progress)
    return get_backend(
        "vllm",
        model_path=manifest["path"],
        dtype=dtype,
        max_model_len=None if max_model_len is None else int(max_model_len),
        tensor_parallel_size=options.get("tensor_parallel_size", 1),
        data_parallel_size=options.get("data_parallel_size", 1),
        gpu_memory_utilization=options.get("gpu_memory_utilization", 0.9),
        enforce_eager=options.get("enforce_eager", True),
        kv_cache_memory_gib=options.get("kv_cache_memory_gib"),
        enable_chunked_prefill=options.get("enable_chunked_prefill"),
        in_process=options.get("in_process", False),
        max_lora_rank=options.get("max_lora_rank"),
        engine_devices=options.get("engine_devices"),
        min_p=min_p,
    )


def run_generations(
    *,
    benchmarks: list[tuple[str, pd.DataFrame]],
    seeds: dict[str, tuple[int | None, list[str | Path]]],
    manifest: dict,
    settings: dict,
    chat_template: dict,
    dtype: str,
    backend_name: str,
    backend_options: dict | None,
    metadata: dict[str, Any],
) -> None:
    """Evaluation-prompt sampling of one checkpoint on several benchmarks with one or more
    evaluation seeds (what rule ``generate`` runs): the model is loaded (or the engine started)
    once. ``benchmarks`` holds ``(name, table)``; ``seeds`` maps a seed name to its per-request seed
    and the output path of each benchmark. Samples depend only on prompt, seed and model (per-sample
    generators), so one job per seed and one job for all seeds write the same files.

    ``settings`` are the evaluation sampling settings (``pwopsd.config.eval_sampling_settings``).
    """
    from pwopsd.models import load_tokenizer

    from pwopsd.notice import Notice

    first = SamplingConfig.from_evaluation(settings, None)
    tokenizer = load_tokenizer(manifest)
    identity = generation_identity(manifest, dtype=dtype, backend_name=backend_name, backend_options=backend_options)
    # On a notice signal (Slurm's warning, time limit, preemption) the shard in progress is finished
    # and the job stops resumable; every finished shard is kept until the last output is written.
    with Notice() as notice, make_backend(backend_name, manifest, dtype=dtype, max_model_len=first.max_model_len,
                                          min_p=first.min_p, options=backend_options, tokenizer=tokenizer) as backend:
        for seed_name, (seed, outputs) in seeds.items():
            sampling = SamplingConfig.from_evaluation(settings, seed)
            for (name, table), output in zip(benchmarks, outputs, strict=True):
                _sample_one_benchmark(backend, tokenizer, name, table, output, manifest=manifest, settings=settings,
                                      sampling=sampling, chat_template=chat_template,
                                      metadata={**metadata, "seed_name": seed_name, "backend_options": backend_options},
                                      notice=notice, identity=identity)
    for _, outputs in seeds.values():
        for output in outputs:
            clear_partial(output)


# Metadata of a generation that is a record, not a cause: the package versions (result-relevant
# libraries are in the identity's versions), the model's path (its weights are in the identity by
# content; the same Hub cache mounted elsewhere holds the same work) and the backend's execution
# options (see generation_identity).
NOT_IN_SHARD_KEY = ("versions", "model_path", "backend_options")


def generation_identity(manifest: dict, *, dtype: str, backend_name: str, backend_options: dict | None,
                        code: str = "pwopsd.generation.sampling", **engine) -> dict:
    """What a generating job's kept shards are the work of besides its requests: the checkpoint's
    weights by content, dtype, backend, the engine settings that shape the samples (``engine``, e.g.
    the engine's ``max_model_len``), the code of the ``code`` entry module and what it imports.
    Generation, the diagnostic's spines and forced continuations.

    ``backend_options`` (batch sizes, memory fractions, parallel layout, eager mode) are not in it:
    they change speed, not the sampled distribution, and they are what a user turns to recover
    from an out-of-memory or a time limit, which must not discard the shards already made. (On a
    GPU a batch's composition can change the bits of a sample, never its distribution; the
    parquet's metadata records the options each file was made under.)"""
    from pwopsd.keys import part_key

    del backend_options  # a record (provenance), not a cause
    return part_key(manifest, code=(code,), dtype=dtype, backend=backend_name, engine=dict(engine))


def _sample_one_benchmark(backend, tokenizer, name, table, output, *, manifest, settings, sampling, chat_template,
                          metadata, notice=None, identity=None) -> None:
    ids = eval_prompt_ids(
        tokenizer,
        list(table["problem"]),
        enable_thinking=bool(settings.get("enable_thinking", True)),
        add_special_tokens=bool(chat_template.get("add_special_tokens", True)),
    )
    meta = {
        **metadata,
        "benchmark": name,
        "model_path": manifest["path"],
        "hf_id": manifest.get("hf_id"),
        "revision": manifest.get("revision"),
        "prompt": "eval",
        "enable_thinking": bool(settings.get("enable_thinking", True)),
        "chat_template": chat_template,
    }
    log.info("sampling %s (%d problems)", name, len(table))
    sample_benchmark(backend, list(table["id"]), ids, sampling, output=output, metadata=meta, notice=notice, clear=False,
                     identity=identity)


def generation_path(model: str, checkpoint: str, benchmark: str, seed: str) -> str:
    """Where rule ``generate`` writes one benchmark's samples of one checkpoint and seed (wildcard
    names in braces give the rule's output pattern)."""
    return f"results/generations/{model}/{checkpoint}/{benchmark}/seed-{seed}.parquet"
