"""The cost plan's estimates: Snakemake's jobs (from its dry run) and the wall hours of each GPU
job, from its token budget in the validated config and the throughput :data:`ASSUMPTIONS`."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from pwopsd.config import checkpoint_seed_names, diagnostic_settings, training_config

# Throughput and length assumptions (H100 80GB, bf16). Throughputs scale with 1 / model size.
ASSUMPTIONS = {
    # vLLM decode throughput per GPU at high concurrency for a 4B model (20k tok/s on 4 GPUs, TP=4).
    "decode_tok_s_per_gpu_4b": 5000.0,
    # Single-stream decode speed of a 4B model at TP=4: the longest sample bounds a job from below.
    "stream_tok_s_4b": 150.0,
    # An engine on one GPU (tensor_parallel_size 1, data parallel across the job's GPUs) relative to
    # TP=4: per-GPU throughput (no all-reduce per layer; a 4-8B model leaves most of an H100 to the
    # KV cache) and single-stream speed (one GPU's memory bandwidth instead of four).
    "decode_gain_tp1": 1.6,
    "stream_gain_tp1": 0.5,
    # HF forward (no grad) throughput per GPU for a 4B model (teacher pass, MC dropout).
    "forward_tok_s_per_gpu_4b": 40000.0,
    # Mean generated length as a fraction of the token budget.
    "eval_length_fraction": 0.25,      # 38,912-token budget; thinking models on MATH-500/AIME/HMMT
    "spine_length_fraction": 0.5,      # greedy spines within 16K
    "spine_fallback_share": 0.15,      # problems re-sampled at T=0.7
    "forced_length_fraction": 0.25,    # forced continuations within the 32K context
    "teacher_prompt_tokens": 400.0,
    # Training rollouts with training.rollout_backend: hf (transformers decoding on the unmerged
    # PEFT model, a few sequences per GPU): throughput per GPU and single-stream speed, 4B model.
    "hf_rollout_tok_s_per_gpu_4b": 250.0,
    "hf_stream_tok_s_4b": 30.0,
    # Training with rollout_policy: merged_bf16 on a vLLM rollout engine: the merged bf16 weights
    # written to the engine's folder and reloaded every step, seconds per billion parameters (2 GB:
    # written, then read back from the page cache, at ~2 GB/s each).
    "merged_sync_s_per_b_params": 2.0,
    # Training: per-step overhead beyond rollout decode and forward/backward (adapter sync,
    # optimizer, logging), seconds.
    "train_step_overhead_s": 30.0,
    # A training step's estimated time is multiplied by this (1: the model above as is); a run's
    # measured steps correct it (python -m pwopsd.status --fit-overlay).
    "train_step_scale": 1.0,
    "train_prompt_tokens": 600.0,
    # Model loading / engine start per job, minutes.
    "startup_min": 5.0,
    # Grading (CPU): mean wall seconds of one math-verify comparison on one worker (parse + verify of
    # a prediction against a gold or another prediction), and the distinct formatted predictions of a
    # problem as a fraction of N (Maj@N clustering compares every ordered pair of them).
    "grade_s": 0.1,
    "maj_distinct_fraction": 0.5,
    # Writing a training checkpoint (LoRA adapter, AdamW moments, RNG and scheduler states), seconds.
    "checkpoint_s": 60.0,
    # Shutting one vLLM engine down: a data-parallel rank's join timeout (generation/vllm_backend.py,
    # _EngineProcess.stop); a job's ranks are stopped one after the other, seconds.
    "engine_shutdown_s": 60.0,
    # A time-limit warning must hold this many times the estimated work of the piece in progress
    # (the estimates are planning figures, not measurements); engine shutdowns are bounds, added as is.
    "notice_safety": 1.5,
}


def assumptions(cfg: dict | None) -> dict:
    """:data:`ASSUMPTIONS` with the config's corrections (``cluster.cost_assumptions``, e.g. an
    overlay written by ``python -m pwopsd.status --fit-overlay``); an unknown name or a value that
    is not a positive number is an error naming the key."""
    a = dict(ASSUMPTIONS)
    for key, value in ((cfg or {}).get("cluster", {}).get("cost_assumptions") or {}).items():
        if key not in a:
            raise SystemExit(f"config key cluster.cost_assumptions.{key}: unknown assumption (known: {', '.join(a)})")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise SystemExit(f"config key cluster.cost_assumptions.{key}: {value!r} is not a positive number")
        a[key] = float(value)
    return a


@dataclass
class Job:
    rule: str
    wildcards: dict[str, str]
    gpus: int
    resources: dict[str, str] = field(default_factory=dict)
    threads: int = 1
    input: list[str] = field(default_factory=list)
    output: list[str] = field(default_factory=list)
    benchmark: str | None = None
    reason: str = ""            # why Snakemake runs it (its dry run's ``reason:`` line)

    @property
    def key(self) -> str:
        """The job's name on Slurm: the comment the executor plugin gives its submissions
        (``rule_<rule>_wildcards_<values joined by _>``, each / as _)."""
        return slurm_comment(self.rule, self.wildcards)


def slurm_comment(rule: str, wildcards: dict) -> str:
    values = "_".join(str(v) for v in wildcards.values()).replace("/", "_")
    return f"rule_{rule}_wildcards_{values}" if wildcards else f"rule_{rule}"


def _file_list(line: str | None) -> list[str]:
    return [f for f in line.split(", ") if f] if line else []


def parse_dry_run(output: str) -> list[Job]:
    """The jobs of a ``snakemake -n`` listing: rule, wildcards, resources (as printed), GPUs, threads,
    input and output files, benchmark file."""
    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", output):
        m = re.match(r"(?:local)?rule (\w+):", block)
        if not m:
            continue
        wc = re.search(r"^\s+wildcards: (.*)$", block, re.M)
        res = re.search(r"^\s+resources: (.*)$", block, re.M)
        threads = re.search(r"^\s+threads: (\d+)$", block, re.M)
        reason = re.search(r"^\s+reason: (.*)$", block, re.M)
        files = {name: re.search(rf"^\s+{name}: (.*)$", block, re.M) for name in ("input", "output", "benchmark")}
        resources = dict(kv.split("=", 1) for kv in res.group(1).split(", ")) if res else {}
        jobs.append(Job(m.group(1), dict(kv.split("=", 1) for kv in wc.group(1).split(", ")) if wc else {},
                        int(resources.get("gpu", 0)), resources, int(threads.group(1)) if threads else 1,
                        *(_file_list(files[n] and files[n].group(1)) for n in ("input", "output")),
                        files["benchmark"].group(1) if files["benchmark"] else None, reason.group(1) if reason else ""))
    return jobs


def run_snakemake(args: list[str]) -> subprocess.CompletedProcess:
    """``python -m snakemake ARGS`` in this process's directory and environment, its output
    captured. (The test suite replaces it with a dry run forked from a process that has imported
    Snakemake once: ``tests/dry_runs.py``.)"""
    return subprocess.run([sys.executable, "-m", "snakemake", *args], capture_output=True, text=True)


def dry_run_jobs(directory: str, targets: list[str], *, forceall: bool, configfiles: list[str] = (),
                 rerun_incomplete: bool = False) -> list[Job]:
    """Jobs of ``snakemake -n`` for the targets (with the overlay ``configfiles``); ``rerun_incomplete``:
    outputs a running or cut-off job left incomplete count as to be made (as the profile's
    ``rerun-incomplete: true``), instead of stopping the dry run."""
    repo = Path(__file__).resolve().parents[3]
    args = ["-s", str(repo / "Snakefile"), "-n", "--directory", directory, *targets]
    if configfiles:
        args += ["--configfile", *configfiles]
    if forceall:
        args.append("--forceall")
    if rerun_incomplete:
        args.append("--rerun-incomplete")
    proc = run_snakemake(args)
    if proc.returncode != 0:
        raise SystemExit(f"snakemake dry run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return parse_dry_run(proc.stdout + "\n" + proc.stderr)


def model_size_b(cfg: dict, model: str) -> float:
    """Parameters in billions: ``size_b`` of the model entry, else read from its Hub id ("…-4B")."""
    entry = cfg["models"][model]
    if entry.get("size_b"):
        return float(entry["size_b"])
    m = re.search(r"(\d+(?:\.\d+)?)[Bb]\b", entry.get("hf_id", ""))
    if not m:
        raise SystemExit(f"models.{model}: set size_b (parameters in billions) for the cost plan")
    return float(m.group(1))


def _decode_hours(tokens: float, longest: float, size: float, gpus: int, a: dict, tp: int = 4) -> float:
    """Hours to decode ``tokens`` on ``gpus`` GPUs with engines of ``tp`` GPUs each (at least the
    single-stream time of the ``longest`` sample)."""
    rate = a["decode_tok_s_per_gpu_4b"] * 4.0 / size * max(1, gpus) * (a["decode_gain_tp1"] if tp == 1 else 1.0)
    tail = longest / (a["stream_tok_s_4b"] * 4.0 / size * (a["stream_gain_tp1"] if tp == 1 else 1.0))
    return max(tokens / rate, tail) / 3600.0


def _vllm_tp(cfg: dict, job: Job) -> int:
    return int(cfg["models"][job.wildcards["model"]].get("vllm", {}).get("tensor_parallel_size", 1))


def data_parallel_layout(cfg: dict) -> dict:
    """``cfg`` with every model's vLLM engines on one GPU each (tensor_parallel_size 1,
    data_parallel_size = gpus.generate): the other way to spend a generation job's GPUs."""
    out = {**cfg, "models": {}}
    for name, entry in cfg["models"].items():
        gpus = max(1, entry["gpus"]["generate"])
        out["models"][name] = {**entry, "vllm": {**entry.get("vllm", {}), "tensor_parallel_size": 1, "data_parallel_size": gpus}}
    return out


def _generate_hours(job: Job, cfg: dict, size: float, a: dict) -> float:
    ev = cfg["evaluation"]
    # a benchmark's rows: expected_rows, or its first_rows when a smoke run keeps fewer
    problems = sum(min(b.get("expected_rows") or 0, b.get("first_rows") or math.inf) for b in cfg["benchmarks"].values())
    # a job per seed ({seed} wildcard), or every seed of its checkpoint (evaluation.seeds_per_job: all)
    seeds = 1 if "seed" in job.wildcards else len(checkpoint_seed_names(cfg, job.wildcards.get("checkpoint", "")))
    tokens = seeds * problems * ev["n"] * ev["max_new_tokens"] * a["eval_length_fraction"]
    return _decode_hours(tokens, ev["max_new_tokens"], size, job.gpus, a, tp=_vllm_tp(cfg, job))


def train_step_seconds(job: Job, cfg: dict, size: float, a: dict) -> float:
    """Seconds of one optimizer step of a training job: rollout decode, forwards and backward, overhead."""
    tr = training_config(cfg, job.wildcards["model"], job.wildcards["method"])
    batch = cfg["training"]["effective_batch"]
    rollout_tokens = batch * tr["max_completion_length"]
    if tr["rollout_backend"] == "vllm":  # one colocated engine per training GPU (TP=1)
        decode = _decode_hours(rollout_tokens, tr["max_completion_length"], size, job.gpus, a, tp=1) * 3600.0
        if tr["rollout_policy"] == "merged_bf16":  # the engine reloads merged weights every step
            decode += a["merged_sync_s_per_b_params"] * size
    else:  # hf generate on the live PEFT model
        rate = a["hf_rollout_tok_s_per_gpu_4b"] * 4.0 / size * max(1, job.gpus)
        decode = max(rollout_tokens / rate, tr["max_completion_length"] / (a["hf_stream_tok_s_4b"] * 4.0 / size))
    seq = batch * (a["train_prompt_tokens"] + tr["max_completion_length"])
    # student forward + backward (3x) and the teacher forward (1x, longer privileged prompt ~2x)
    fwd = 6.0 * seq / (a["forward_tok_s_per_gpu_4b"] * 4.0 / size * job.gpus)
    return (decode + fwd + a["train_step_overhead_s"]) * a["train_step_scale"]


def _train_hours(job: Job, cfg: dict, size: float, a: dict) -> float:
    tr = training_config(cfg, job.wildcards["model"], job.wildcards["method"])
    steps = tr["stop_at"] or tr["max_steps"]  # the steps trained (training.stop_at)
    return steps * train_step_seconds(job, cfg, size, a) / 3600.0


def _diagnostic_sizes(job: Job, cfg: dict, size: float, a: dict) -> tuple[dict, int, float, float]:
    d = diagnostic_settings(cfg, job.wildcards["model"])
    spine = d["spine"]["max_new_tokens"] * a["spine_length_fraction"]
    return d, sum(d["datasets"].values()), spine, a["forward_tok_s_per_gpu_4b"] * 4.0 / size * job.gpus


def _spines_hours(job: Job, cfg: dict, size: float, a: dict) -> float:
    d, problems, spine, _ = _diagnostic_sizes(job, cfg, size, a)
    passes = 1 + a["spine_fallback_share"]
    return passes * _decode_hours(problems * spine, d["spine"]["max_new_tokens"], size, job.gpus, a, tp=_vllm_tp(cfg, job))


def _teacher_pass_hours(job: Job, cfg: dict, size: float, a: dict) -> float:
    _, problems, spine, rate = _diagnostic_sizes(job, cfg, size, a)
    return problems * (spine + a["teacher_prompt_tokens"]) / rate / 3600.0


def _mc_dropout_hours(job: Job, cfg: dict, size: float, a: dict) -> float:
    d, problems, spine, rate = _diagnostic_sizes(job, cfg, size, a)
    return d["mc_dropout"]["samples"] * problems * (spine + a["teacher_prompt_tokens"]) / rate / 3600.0


def forced_lengths(fc: dict, spine: float, a: dict) -> tuple[float, float]:
    """A forced continuation's expected and longest new tokens: a share of the model length
    (``forced_length_fraction``), within ``max_new_tokens`` where the config caps them."""
    longest = fc["max_model_len"] - spine
    if fc.get("max_new_tokens"):
        longest = min(longest, fc["max_new_tokens"])
    return min(fc["max_model_len"] * a["forced_length_fraction"], longest), longest


def _forced_continuation_hours(job: Job, cfg: dict, size: float, a: dict) -> float:
    d, problems, spine, _ = _diagnostic_sizes(job, cfg, size, a)
    fc = d["forced_continuation"]
    rollouts = problems * d["candidates"]["max_per_problem"] * d["candidates"]["children"] * fc["n"]
    expected, longest = forced_lengths(fc, spine, a)
    return _decode_hours(rollouts * expected, longest, size, job.gpus, a, tp=_vllm_tp(cfg, job))


# The cost model of each rule that asks for GPUs; a GPU rule missing here is an error
# (tests/test_cost.py checks the paper DAG), not a silent zero.
GPU_HOURS = {"generate": _generate_hours, "generate_sweep_step": _generate_hours, "train": _train_hours, "spines": _spines_hours,
             "teacher_pass": _teacher_pass_hours, "mc_dropout": _mc_dropout_hours,
             "forced_continuation": _forced_continuation_hours}


def job_hours(job: Job, cfg: dict, a: dict | None = None) -> float:
    """Estimated wall hours of one GPU job (0 for CPU jobs): start-up plus the rule's cost model."""
    a = assumptions(cfg) if a is None else a
    if job.gpus == 0:
        return 0.0
    if job.rule not in GPU_HOURS:
        raise ValueError(f"rule {job.rule} asks for {job.gpus} GPUs but has no cost model in pwopsd.cost.GPU_HOURS")
    size = model_size_b(cfg, job.wildcards.get("model"))
    return a["startup_min"] / 60.0 + GPU_HOURS[job.rule](job, cfg, size, a)



def max_runtime(cfg: dict) -> float:
    """The partition's time limit in minutes (``cluster.max_runtime_min``; none: unlimited)."""
    return float(cfg.get("cluster", {}).get("max_runtime_min", math.inf))


def training_jobs(cfg: dict) -> list[Job]:
    """Every configured training run as the train rule's job (GPUs: the model's ``gpus.train``)."""
    from pwopsd.config import training_runs

    return [Job("train", {"model": model, "method": run}, int(cfg["models"][model]["gpus"]["train"]))
            for model, run in training_runs(cfg)]


