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
    streams: str = "per_prompt"  # GenerationRequest.streams (evaluations: evaluation.sample_streams)

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
            streams=str(evaluation.get("sample_streams", "per_prompt")),
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
            streams=self.streams,
        )


def eval_prompt_ids(tokenizer, problems: Sequence[str], *, enable_thinking: bool, add_special_tokens: bool) -> list[list[int]]:
    """Token ids of the evaluation prompt for each problem (reference: no think-closure)."""
    style = prompts.PromptStyle("eval", enable_thinking=enable_thinking, think_closure=False)
    return [
        prompts.prompt_ids(tokenizer, prompts.eval_message(p), style, add_special_tokens=add_special_tokens)
        for p in problems
    ]


@dataclass(frozen=True)
class Shard:
    """A piece of a resumable generation: requests whose completions are saved together in ``file``
    (one row a completion, carrying its request's ``keys`` columns)."""

    file: Path
    requests: Sequence[GenerationRequest]
    keys: Sequence[dict[str, Any]]


def plan_shards(requests: Sequence[GenerationRequest], keys: Sequence[dict[str, Any]], *, partial: Path,
                shard_size: int = 100) -> list[Shard]:
    """``requests`` cut into shards of ``shard_size`` requests, saved under ``partial`` (the caller
    names it, :func:`partial_dir`, from everything that determines the samples)."""
    if len(keys) != len(requests):
        raise ValueError(f"{len(keys)} key rows for {len(requests)} requests")
    partial.mkdir(parents=True, exist_ok=True)
    return [Shard(partial / f"shard-{s:05d}.parquet", requests[lo : lo + shard_size], keys[lo : lo + shard_size])
            for s, lo in enumerate(range(0, len(requests), shard_size))]


def run_shards(backend: Backend, shards: Sequence[Shard], *, group_size: int = 100, token_ids: bool = False,
               notice=None) -> None:
    """Generate every shard not saved yet and save it. Consecutive shards are generated together,
    in one call of the backend, while their requests number at most ``group_size`` (a shard larger
    than that alone): small benchmarks and several seeds of one job share batches, and a sample does
    not depend on what shares its batch (:class:`~pwopsd.generation.hf_backend.HFBackend`). With a
    ``notice`` (:class:`pwopsd.notice.Notice`) that has received its signal, the group in progress
    is finished and saved, and :class:`~pwopsd.notice.Interrupted` is raised before the next one:
    the job exits resumable and its rerun loses nothing."""
    pending = [shard for shard in shards if not shard.file.exists()]
    done = len(shards) - len(pending)
    if done:
        log.info("%d of %d shards already done, reused", done, len(shards))
    groups: list[list[Shard]] = []
    for shard in pending:
        if groups and sum(len(s.requests) for s in groups[-1]) + len(shard.requests) <= group_size:
            groups[-1].append(shard)
        else:
            groups.append([shard])
    t0 = time.time()
    for group in groups:
        stop_on_notice(notice, f"{done} of {len(shards)} shards saved in {group[0].file.parent}")
        results = iter(backend.generate([r for shard in group for r in shard.requests]))
        samples = 0
        for shard in group:
            frame = _completion_rows(shard, [next(results) for _ in shard.requests], token_ids)
            write_parquet(frame, shard.file)
            samples += len(frame)
        done += len(group)
        log.info("shards %d/%d done: %d samples (%.1fs elapsed)", done, len(shards), samples, time.time() - t0)


def _completion_rows(shard: Shard, results, token_ids: bool) -> pd.DataFrame:
    rows = []
    for key, req, completions in zip(shard.keys, shard.requests, results, strict=True):
        for j, c in enumerate(completions):
            row = {**key, "sample_index": j, "text": c.text, "num_tokens": len(c.token_ids),
                   "finish_reason": c.finish_reason, "prompt_tokens": len(req.prompt_ids)}
            if token_ids:
                row["token_ids"] = list(c.token_ids)
            rows.append(row)
    return pd.DataFrame(rows)


def read_shards(shards: Sequence[Shard], key_columns: Sequence[str] = ()) -> pd.DataFrame:
    """The saved shards' completions in order, one table."""
    if not shards:
        return pd.DataFrame(columns=[*key_columns, "sample_index", "text", "num_tokens", "finish_reason", "prompt_tokens"])
    return pd.concat([pd.read_parquet(shard.file) for shard in shards], ignore_index=True)


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
    shards = plan_shards(requests, keys, partial=partial, shard_size=shard_size)
    run_shards(backend, shards, group_size=shard_size, token_ids=token_ids, notice=notice)
    return read_shards(shards, list(keys[0]) if keys else [])


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
    shards = benchmark_shards(problem_ids, prompt_ids, sampling, output=output, metadata=metadata,
                              shard_size=shard_size, identity=identity)
    run_shards(backend, shards, group_size=shard_size, notice=notice)
    table = write_benchmark(backend, shards, sampling, output=output, metadata=metadata, seconds=time.time() - t0)
    if clear:
        clear_partial(output)
    return table


def benchmark_shards(problem_ids: Sequence[str], prompt_ids: Sequence[Sequence[int]], sampling: SamplingConfig, *,
                     output: str | Path, metadata: dict[str, Any], shard_size: int = 100,
                     identity: dict | None = None) -> list[Shard]:
    """The shards of one benchmark's samples (:func:`sample_benchmark`), kept under a folder beside
    ``output`` named by everything that determines them."""
    requests = [sampling.request(p) for p in prompt_ids]
    key = {"identity": identity, "meta": {k: v for k, v in metadata.items() if k not in NOT_IN_SHARD_KEY},
           "sampling": sampling.__dict__, "ids": list(problem_ids), "prompts": [list(p) for p in prompt_ids]}
    return plan_shards(requests, [{"problem_id": pid} for pid in problem_ids], partial=partial_dir(output, key),
                       shard_size=shard_size)


def write_benchmark(backend: Backend, shards: Sequence[Shard], sampling: SamplingConfig, *, output: str | Path,
                    metadata: dict[str, Any], seconds: float) -> pd.DataFrame:
    """The generations parquet of one benchmark, from its saved shards."""
    table = read_shards(shards, ["problem_id"])
    meta = {**metadata, "sampling": sampling.__dict__, "backend": backend.versions(),
            "reproducible": sampling.seed is not None or backend.unseeded_reproducible,
            "seconds": round(seconds, 3)}
    write_parquet(table, output, metadata=meta)
    return table


def make_backend(name: str, manifest: dict, *, dtype: str, max_model_len: int | None, min_p: float = 0.0,
                 options: dict | None = None, tokenizer=None, progress: bool = True) -> Backend:
    """The configured generation backend for a checkpoint (``hf``: loaded here; ``vllm``: lazily).

    ``options`` are execution settings (``hf_batch_size``; for vLLM a model's ``vllm`` entry:
    ``tensor_parallel_size``, ``data_parallel_size``, ``gpu_memory_utilization``,
    ``enforce_eager``, ``kv_cache_memory_gib``, ``enable_chunked_prefill``, ``in_process``,
    ``block_size``; and
    for a training rollout engine ``max_lora_rank`` and ``engine_devices``, see
    :func:`pwopsd.generation.rollout.make_rollouts`). ``max_model_len`` None: the model's own.
    """
    from pwopsd.generation import get_backend
    from pwopsd.models import default_device, load_model

    options = options or {}
    if name == "hf":
        if min_p:  # the hf sampler has temperature, top-k and top-p only: min_p would be recorded, not applied
            raise ValueError(f"min_p={min_p}: the hf backend samples without a min-p filter; set evaluation.min_p: 0 "
                             "or evaluation.backend: vllm")
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
        block_size=options.get("block_size"),
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
    prompt_ids = {name: eval_prompt_ids(tokenizer, list(table["problem"]),
                                        enable_thinking=bool(settings.get("enable_thinking", True)),
                                        add_special_tokens=bool(chat_template.get("add_special_tokens", True)))
                  for name, table in benchmarks}
    # Every (seed, benchmark) is planned in shards first; then the shards run in groups of at most
    # shard_size problems, so that small benchmarks and several seeds share the backend's batches.
    plan = []  # (output, sampling, metadata, shards)
    for seed_name, (seed, outputs) in seeds.items():
        sampling = SamplingConfig.from_evaluation(settings, seed)
        for (name, table), output in zip(benchmarks, outputs, strict=True):
            meta = {**metadata, "seed_name": seed_name, "backend_options": backend_options, "benchmark": name,
                    "model_path": manifest["path"], "hf_id": manifest.get("hf_id"), "revision": manifest.get("revision"),
                    "prompt": "eval", "enable_thinking": bool(settings.get("enable_thinking", True)),
                    "chat_template": chat_template}
            plan.append((output, sampling, meta, benchmark_shards(list(table["id"]), prompt_ids[name], sampling,
                                                                  output=output, metadata=meta, identity=identity)))
    log.info("sampling %s with %d seed(s): %d problems", ", ".join(f"{name} ({len(table)})" for name, table in benchmarks),
             len(seeds), sum(len(table) for _, table in benchmarks))
    t0 = time.time()
    # On a notice signal (Slurm's warning, time limit, preemption) the group in progress is finished
    # and the job stops resumable; every finished shard is kept until the last output is written.
    with Notice() as notice, make_backend(backend_name, manifest, dtype=dtype, max_model_len=first.max_model_len,
                                          min_p=first.min_p, options=backend_options, tokenizer=tokenizer) as backend:
        run_shards(backend, [shard for *_, shards in plan for shard in shards], notice=notice)
        for output, sampling, meta, shards in plan:
            write_benchmark(backend, shards, sampling, output=output, metadata=meta, seconds=time.time() - t0)
    for output, *_ in plan:
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


def generation_path(model: str, checkpoint: str, benchmark: str, seed: str) -> str:
    """Where rule ``generate`` writes one benchmark's samples of one checkpoint and seed (wildcard
    names in braces give the rule's output pattern)."""
    return f"results/generations/{model}/{checkpoint}/{benchmark}/seed-{seed}.parquet"
