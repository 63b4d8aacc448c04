"""Cost plan: how many jobs each rule will run and the GPU-hours they are expected to take.

    python -m pwopsd.cost [--directory DIR] [--all] [--assume KEY=VALUE ...] [TARGET ...]

The jobs are Snakemake's own plan (a dry run of the targets, default the whole workflow; with
``--all`` as if nothing existed yet). Each job's wall time is estimated from its token budget in
the validated config and the throughput assumptions in :data:`ASSUMPTIONS` (documented in
docs/cluster.md, overridable with ``--assume``); GPU-hours = GPUs of the job x wall hours. CPU-only
rules cost no GPU-hours and are listed with their job counts.
"""

from __future__ import annotations

import argparse
import math
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from pwopsd.cluster import PROFILE, WARNING_SIGNAL, Profile, RuleLimits, runtime_minutes
from pwopsd.config import checkpoint_seed_names, diagnostic_settings, load_config, load_config_files, training_config
from pwopsd.notice import NOTICE_GRACE_SECONDS

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


def dry_run_jobs(directory: str, targets: list[str], *, forceall: bool, configfiles: list[str] = (),
                 rerun_incomplete: bool = False) -> list[Job]:
    """Jobs of ``snakemake -n`` for the targets (with the overlay ``configfiles``); ``rerun_incomplete``:
    outputs a running or cut-off job left incomplete count as to be made (as the profile's
    ``rerun-incomplete: true``), instead of stopping the dry run."""
    repo = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "snakemake", "-s", str(repo / "Snakefile"), "-n", "--directory", directory, *targets]
    if configfiles:
        cmd += ["--configfile", *configfiles]
    if forceall:
        cmd.append("--forceall")
    if rerun_incomplete:
        cmd.append("--rerun-incomplete")
    proc = subprocess.run(cmd, capture_output=True, text=True)
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


def _forced_continuation_hours(job: Job, cfg: dict, size: float, a: dict) -> float:
    d, problems, spine, _ = _diagnostic_sizes(job, cfg, size, a)
    fc = d["forced_continuation"]
    rollouts = problems * d["candidates"]["max_per_problem"] * d["candidates"]["children"] * fc["n"]
    tokens = rollouts * fc["max_model_len"] * a["forced_length_fraction"]
    return _decode_hours(tokens, fc["max_model_len"] - spine, size, job.gpus, a, tp=_vllm_tp(cfg, job))


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


def plan(jobs: list[Job], cfg: dict, a: dict | None = None, profile: Profile | None = None) -> list[dict]:
    """Per rule: jobs, GPUs a job, hours, GPU-hours, and the attempts its longest job needs under the
    profile's time limits (``profile``, default this repository's Slurm profile): attempt k gets the
    rule's runtime at k, capped at ``cluster.max_runtime_min``; a job that stops on notice resumes in
    the next attempt (:data:`NOTICE_KINDS`), any other job must fit one attempt."""
    a = assumptions(cfg) if a is None else a
    profile = profile or Profile.from_file()
    cap = max_runtime(cfg)
    rows: dict[str, dict] = {}
    for job in jobs:
        h = job_hours(job, cfg, a)
        row = rows.setdefault(job.rule, {"rule": job.rule, "jobs": 0, "gpus": set(), "hours": 0.0, "gpu_hours": 0.0,
                                         "attempts": 1})
        row["attempts"] = max(row["attempts"], rule_attempts(h, job.rule, profile, cap, a))
        row["jobs"] += 1
        row["gpus"].add(job.gpus)
        row["hours"] += h
        row["gpu_hours"] += h * job.gpus
    return sorted(rows.values(), key=lambda r: (-r["gpu_hours"], r["rule"]))


def max_runtime(cfg: dict) -> float:
    """The partition's time limit in minutes (``cluster.max_runtime_min``; none: unlimited)."""
    return float(cfg.get("cluster", {}).get("max_runtime_min", math.inf))


# ---------------------------------------------------------------------------------------------
# Attempts: Slurm stops each attempt at its time limit, which the profile writes as an expression of
# `attempt` (min(base * attempt, cap)); a job that stops on notice does its limit less its start-up
# and its warning window of work, and the next attempt resumes.


def attempt_limits(runtime, cap_min: float, most: int = 64) -> list[float]:
    """Minutes of attempts 1, 2, ... of a profile ``runtime`` (a number or an expression of
    ``attempt``) under ``cap_min``, up to the first that reaches the cap or stops growing: every
    later attempt gets the last one's limit."""
    if runtime is None:  # no runtime in the profile: the partition's limit
        return [cap_min]
    limits = []
    for attempt in range(1, most + 1):
        limits.append(min(runtime_minutes(runtime, attempt, cap_min), cap_min))
        if limits[-1] >= cap_min or (len(limits) > 1 and limits[-1] <= limits[-2]):
            break
    return limits


def usable_minutes(limit_min: float, a: dict = ASSUMPTIONS, window_s: float = NOTICE_GRACE_SECONDS) -> float:
    """Minutes of work an attempt limited to ``limit_min`` does: less its start-up and the warning
    window before the limit (``window_s``), in which it finishes its piece in progress and saves it."""
    return limit_min - a["startup_min"] - window_s / 60.0


def attempts_needed(hours: float, limits, a: dict = ASSUMPTIONS, window_s: float = NOTICE_GRACE_SECONDS,
                    resumes: bool = True) -> int:
    """Attempts (submissions) that a job of ``hours`` (start-up included) needs when attempt k is
    stopped at ``limits[k - 1]`` minutes (the last entry holds for every later attempt; a number:
    every attempt's limit). A job that ``resumes`` carries each attempt's work over (warned
    ``window_s`` before the limit); any other job must fit one attempt. 0: never."""
    limits = [float(limits)] if isinstance(limits, (int, float)) else [float(x) for x in limits]
    work = max(0.0, hours * 60.0 - a["startup_min"])
    done = 0.0
    for attempt, limit in enumerate(limits, start=1):
        if not resumes:
            if hours * 60.0 <= limit + 1e-9:
                return attempt
            continue
        done += max(0.0, usable_minutes(limit, a, window_s))
        if done >= work - 1e-9:
            return attempt
    usable = usable_minutes(limits[-1], a, window_s)
    if not resumes or usable <= 0:
        return 0  # never: cap_problems says why
    return len(limits) + max(1, math.ceil((work - done) / usable - 1e-9))


def warning_seconds(limits: RuleLimits) -> float:
    """Seconds of a rule's warning window (0: none: the job hears of its limit only when it is reached)."""
    return float(limits.warning.seconds) if limits.warning else 0.0


def rule_attempts(hours: float, rule: str, profile: Profile, cap_min: float, a: dict = ASSUMPTIONS) -> int:
    """Attempts a job of ``rule`` lasting ``hours`` needs under ``profile``'s limits for the rule."""
    limits = profile.limits(rule)
    try:
        per_attempt = attempt_limits(limits.runtime, cap_min)
    except ValueError as exc:
        raise ValueError(f"{profile.source}: {limits.runtime_key}: {exc}") from None
    return attempts_needed(hours, per_attempt, a, warning_seconds(limits), resumes=rule in NOTICE_KINDS)


def training_jobs(cfg: dict) -> list[Job]:
    """Every configured training run as the train rule's job (GPUs: the model's ``gpus.train``)."""
    from pwopsd.config import training_runs

    return [Job("train", {"model": model, "method": run}, int(cfg["models"][model]["gpus"]["train"]))
            for model, run in training_runs(cfg)]


def train_retries(cfg: dict, a: dict | None = None, failures: int = 2, profile: Profile | None = None) -> int:
    """The train rule's retries on a cluster: the attempts its longest run needs under the profile's
    limits for the rule (attempt k: ``min(base * k, cluster.max_runtime_min)``; each resumes from
    the checkpoint the previous one wrote on notice), beyond the first, plus ``failures`` for
    crashes, node failures and memory kills."""
    a = assumptions(cfg) if a is None else a
    profile = profile or Profile.from_file()
    cap = max_runtime(cfg)
    needed = [rule_attempts(job_hours(job, cfg, a), "train", profile, cap, a) for job in training_jobs(cfg) if job.gpus]
    return max(needed, default=1) - 1 + failures


# ---------------------------------------------------------------------------------------------
# Notice windows: a job of these rules stops on notice (pwopsd.notice): it finishes the piece in
# progress, saves it, shuts its engines down and exits 75; Slurm's warning (--signal=TERM@N in the
# rule's slurm_extra) must come early enough for that, or the piece is lost at the kill (SIGKILL
# KillWait, 30 s by default, after the limit's SIGTERM).

# Rule -> job kind; the kind decides the piece a job finishes after the warning.
NOTICE_KINDS = {"train": "train", "generate": "generate", "generate_sweep_step": "generate", "grade": "grade",
                "grade_sweep_step": "grade", "spines": "spines", "forced_continuation": "forced_continuation"}


def shard_sizes() -> dict[str, int]:
    """Requests a resumable job saves at once, read from the functions that shard them (the jobs use
    their defaults): a generation shard (problems of a benchmark), a spine shard, a forced-continuation
    shard ((candidate, child) requests)."""
    import inspect

    from pwopsd.diagnostic.phases import run_spines
    from pwopsd.generation.sampling import generate_resumable, sample_benchmark

    def default(fn):
        return int(inspect.signature(fn).parameters["shard_size"].default)

    return {"generate": default(sample_benchmark), "spines": default(run_spines),
            "forced_continuation": default(generate_resumable)}


@dataclass(frozen=True)
class NoticeWork:
    """What a job finishes after the warning: its piece in progress (``piece_s``), saving it
    (``save_s``), then its engines' shutdown (``shutdown_s``); :attr:`seconds` is the window it needs."""

    rule: str
    job: str       # which job: model, or model/run
    piece: str     # what the piece is
    piece_s: float
    save_s: float
    shutdown_s: float
    safety: float

    @property
    def seconds(self) -> float:
        return self.safety * (self.piece_s + self.save_s) + self.shutdown_s

    def explain(self) -> str:
        save = f" + {self.save_s:.0f} s to save it" if self.save_s else ""
        shutdown = f" + {self.shutdown_s:.0f} s engine shutdown" if self.shutdown_s else ""
        return (f"{self.piece} {self.piece_s:.0f} s{save}, x{self.safety:g} (notice_safety){shutdown} = "
                f"{self.ceil_seconds} s")

    @property
    def ceil_seconds(self) -> int:
        return math.ceil(self.seconds - 1e-6)


def _rows(bench: dict, unknown: float) -> float:
    """A benchmark's problems (``expected_rows``, a generated benchmark's ``source.n``, else
    ``unknown``; ``first_rows`` when a smoke run keeps fewer)."""
    rows = bench.get("expected_rows") or (bench.get("source") or {}).get("n") or unknown
    return min(rows, bench.get("first_rows") or math.inf)


def _engines(cfg: dict, model: str) -> int:
    """vLLM engines a generation job of ``model`` shuts down (0 with the hf backend)."""
    if cfg["evaluation"].get("backend") != "vllm":
        return 0
    return max(1, int(cfg["models"][model].get("vllm", {}).get("data_parallel_size", 1) or 1))


def generation_shard_seconds(job: Job, cfg: dict, size: float, a: dict, shard: int) -> tuple[float, str]:
    ev = cfg["evaluation"]
    problems = min(shard, max(_rows(b, shard) for b in cfg["benchmarks"].values()))
    tokens = problems * ev["n"] * ev["max_new_tokens"] * a["eval_length_fraction"]
    seconds = _decode_hours(tokens, ev["max_new_tokens"], size, job.gpus, a, tp=_vllm_tp(cfg, job)) * 3600.0
    return seconds, f"one generation shard ({problems:g} problems x {ev['n']} samples <= {ev['max_new_tokens']} tokens)"


def spine_shard_seconds(job: Job, cfg: dict, size: float, a: dict, shard: int) -> tuple[float, str]:
    d, problems, spine, _ = _diagnostic_sizes(job, cfg, size, a)
    n = min(shard, problems)
    seconds = _decode_hours(n * spine, d["spine"]["max_new_tokens"], size, job.gpus, a, tp=_vllm_tp(cfg, job)) * 3600.0
    return seconds, f"one spine shard ({n} spines <= {d['spine']['max_new_tokens']} tokens)"


def forced_shard_seconds(job: Job, cfg: dict, size: float, a: dict, shard: int) -> tuple[float, str]:
    d, problems, spine, _ = _diagnostic_sizes(job, cfg, size, a)
    fc = d["forced_continuation"]
    n = min(shard, problems * d["candidates"]["max_per_problem"] * d["candidates"]["children"])
    tokens = n * fc["n"] * fc["max_model_len"] * a["forced_length_fraction"]
    seconds = _decode_hours(tokens, fc["max_model_len"] - spine, size, job.gpus, a, tp=_vllm_tp(cfg, job)) * 3600.0
    return seconds, f"one forced-continuation shard ({n} requests x {fc['n']} rollouts)"


def grading_pair_seconds(cfg: dict, a: dict) -> tuple[float, str]:
    """One benchmark-seed pair of the largest benchmark, graded by every grader: a comparison per
    sample with its gold, and each problem's Maj@N clustering (every ordered pair of its distinct
    predictions, at most ``grading.maj_budget`` seconds a problem), on ``grading.workers`` workers."""
    ev, gr = cfg["evaluation"], cfg["grading"]
    problems = max(_rows(b, 0) for b in cfg["benchmarks"].values())
    workers, n, graders = int(gr["workers"]), int(ev["n"]), len(gr["graders"])
    distinct = max(1.0, a["maj_distinct_fraction"] * n)
    maj = min(float(gr["maj_budget"]), distinct ** 2 * a["grade_s"] / workers)
    seconds = graders * problems * (n * a["grade_s"] / workers + maj)
    return seconds, f"one grading pair ({problems:g} problems x {n} samples, {graders} graders, {workers} workers)"


def notice_work(rule: str, cfg: dict, a: dict | None = None) -> list[NoticeWork]:
    """What each job of ``rule`` (a key of :data:`NOTICE_KINDS`) finishes after the warning, one
    entry per model (training: per run); GPU jobs of a model with no GPUs or built by the workflow
    (the tiny CPU model: no H100 figures) are left out. A hub model with no size is an error
    (SystemExit, as in the cost plan)."""
    a = assumptions(cfg) if a is None else a
    from pwopsd.config import diagnostic_models, eval_models, training_runs

    kind = NOTICE_KINDS[rule]
    safety = a["notice_safety"]
    if kind == "grade":
        seconds, piece = grading_pair_seconds(cfg, a)
        return [NoticeWork(rule, "the largest benchmark", piece, seconds, 0.0, 0.0, safety)]
    if kind == "train":
        jobs = training_jobs(cfg)
    else:
        models = diagnostic_models(cfg) if kind in ("spines", "forced_continuation") else \
            list(dict.fromkeys([*eval_models(cfg), *(m for m, _ in training_runs(cfg))]))
        jobs = [Job(rule, {"model": m, "checkpoint": "base"}, int(cfg["models"][m]["gpus"]["generate"])) for m in models]
    out = []
    shard = None if kind == "train" else shard_sizes()[kind]
    for job in jobs:
        model = job.wildcards["model"]
        if job.gpus == 0 or "built_by" in cfg["models"][model]:
            continue
        size = model_size_b(cfg, model)
        if kind == "train":
            tr = training_config(cfg, model, job.wildcards["method"])
            engines = 1 if tr["rollout_backend"] == "vllm" else 0  # one per rank, stopped side by side
            out.append(NoticeWork(rule, f"{model}/{job.wildcards['method']}", "one training step",
                                  train_step_seconds(job, cfg, size, a), a["checkpoint_s"],
                                  engines * a["engine_shutdown_s"], safety))
            continue
        piece_of = {"generate": generation_shard_seconds, "spines": spine_shard_seconds,
                    "forced_continuation": forced_shard_seconds}[kind]
        seconds, piece = piece_of(job, cfg, size, a, shard)
        out.append(NoticeWork(rule, model, piece, seconds, 0.0, _engines(cfg, model) * a["engine_shutdown_s"], safety))
    return out


def needed_window(rule: str, cfg: dict, a: dict | None = None) -> NoticeWork | None:
    """The job of ``rule`` that needs the longest warning window (None: no job to price)."""
    a = assumptions(cfg) if a is None else a
    work = notice_work(rule, cfg, a)
    return max(work, key=lambda w: w.seconds) if work else None


def window_problems(cfg: dict, profile: Profile | None = None, rules=None, a: dict | None = None) -> list[str]:
    """Rules of :data:`NOTICE_KINDS` (those of ``rules`` when given: the rules the workflow has)
    whose warning cannot hold the work a job finishes on notice: none, not SIGTERM to the job step,
    or shorter than the longest job's need. One message per rule, naming the profile setting."""
    a = assumptions(cfg) if a is None else a
    profile = profile or Profile.from_file()
    problems = []
    for rule in NOTICE_KINDS:
        if rules is not None and rule not in rules:
            continue
        limits = profile.limits(rule)
        where = f"{profile.source}: {limits.slurm_extra_key}"
        try:
            need = needed_window(rule, cfg, a)
        except SystemExit as exc:  # a model with no size
            problems.append(f"{exc} (the notice window of rule {rule} is derived from it)")
            continue
        warning = limits.warning
        if warning is None:
            if need is not None:
                problems.append(f"{where} asks for no warning: a {rule} job stops on notice, but would hear of its "
                                f"time limit only at the limit, with Slurm's KillWait (30 s by default) left for "
                                f"{need.explain()}; add '--signal={WARNING_SIGNAL}@N' with N >= {need.ceil_seconds}")
            continue
        if warning.signal != WARNING_SIGNAL or warning.batch_only:
            problems.append(f"{where} asks for --signal={'B:' if warning.batch_only else ''}{warning.signal}@"
                            f"{warning.seconds}: the warning must be SIGTERM to the job step ('--signal="
                            f"{WARNING_SIGNAL}@N', no B:), the signal a job's Snakemake waits on and its script "
                            "stops on (docs/cluster.md)")
        elif need is not None and warning.seconds < need.ceil_seconds:
            problems.append(f"{where} warns {rule} jobs {warning.seconds} s before their time limit, too short for "
                            f"{need.job}: {need.explain()}; raise N in '--signal={WARNING_SIGNAL}@N' to at least "
                            f"{need.ceil_seconds}")
    return problems


def cap_problems(cfg: dict, a: dict | None = None, profile: Profile | None = None, rules=None) -> list[str]:
    """Jobs that cannot progress under ``cluster.max_runtime_min``: an attempt at the cap must hold
    the start-up (GPU jobs), one piece (a training step, a shard, a grading pair) and the rule's
    warning window. One message per job, with the numbers."""
    a = assumptions(cfg) if a is None else a
    profile = profile or Profile.from_file()
    cap = max_runtime(cfg)
    problems = []
    for rule in NOTICE_KINDS:
        if rules is not None and rule not in rules:
            continue
        window = warning_seconds(profile.limits(rule)) / 60.0
        try:
            work = notice_work(rule, cfg, a)
        except SystemExit:
            continue  # window_problems names the missing size
        for w in work:
            startup = 0.0 if NOTICE_KINDS[rule] == "grade" else a["startup_min"]
            piece = w.piece_s / 60.0
            if cap - startup - window < piece:
                what = f"training {w.job}" if rule == "train" else f"{rule} jobs of {w.job}"
                problems.append(f"cluster.max_runtime_min={cap:g} is too short for {what}: an attempt needs "
                                f"{startup:g} min start-up + {piece:.1f} min for {w.piece} + {window:g} min notice "
                                f"window ({profile.limits(rule).slurm_extra_key}) = {startup + piece + window:.1f} min")
    return problems


# Rules whose GPUs run vLLM engines (the layout comparison re-prices these).
VLLM_RULES = ("generate", "spines", "forced_continuation")


def render_windows(cfg: dict, profile: Profile, a: dict | None = None) -> list[str]:
    """One line per rule that stops on notice: the warning the profile asks for and the window its
    longest job needs (the same check as at the workflow's start)."""
    a = assumptions(cfg) if a is None else a
    lines = []
    for rule in NOTICE_KINDS:
        try:
            need = needed_window(rule, cfg, a)
        except SystemExit:
            continue
        warning = profile.limits(rule).warning
        given = f"--signal={warning.signal}@{warning.seconds}" if warning else "no warning"
        lines.append(f"  {rule:<20} {given:<20} needs " + (f"{need.ceil_seconds} s ({need.job}: {need.explain()})"
                                                               if need else "nothing (no job to price)"))
    return lines


def render(rows: list[dict], a: dict, data_parallel: list[dict] | None = None, cfg: dict | None = None,
           profile: Profile | None = None) -> str:
    lines = [f"{'rule':<22}{'jobs':>6}{'GPUs/job':>10}{'h/job':>8}{'GPU-hours':>11}{'attempts':>10}"]
    for r in rows:
        gpus = "/".join(str(g) for g in sorted(r["gpus"]))
        per_job = r["hours"] / r["jobs"] if r["jobs"] else 0.0
        attempts = str(r["attempts"]) if r["attempts"] else "never"
        lines.append(f"{r['rule']:<22}{r['jobs']:>6}{gpus:>10}{per_job:>8.2f}{r['gpu_hours']:>11.1f}{attempts:>10}")
    total_jobs = sum(r["jobs"] for r in rows)
    total = sum(r["gpu_hours"] for r in rows)
    lines.append(f"{'total':<22}{total_jobs:>6}{'':>10}{'':>8}{total:>11.1f}")
    lines.append(f"= {total / 24:.1f} GPU-days, {total / 4:.0f} hours of 4xH100 nodes")
    if cfg is not None:
        profile = profile or Profile.from_file()
        lines.append(f"attempts: submissions the longest job of a rule needs when attempt k stops at the profile's runtime "
                     f"at k (min(base x k, cluster.max_runtime_min={cfg['cluster']['max_runtime_min']} min)) and the next "
                     f"resumes from its checkpoint (train: retries {train_retries(cfg, a, profile=profile)} on the cluster)")
        lines.append(f"notice windows ({profile.source}, set-resources.<rule>.slurm_extra) and what each needs:")
        lines += render_windows(cfg, profile, a)
    if data_parallel is not None and cfg is not None:
        layout = ", ".join(f"{m} TP={e.get('vllm', {}).get('tensor_parallel_size', 1)} x "
                           f"DP={e.get('vllm', {}).get('data_parallel_size', 1)}" for m, e in cfg["models"].items())
        vllm_now = sum(r["gpu_hours"] for r in rows if r["rule"] in VLLM_RULES)
        vllm_dp = sum(r["gpu_hours"] for r in data_parallel if r["rule"] in VLLM_RULES)
        total_dp = sum(r["gpu_hours"] for r in data_parallel)
        lines.append(f"vLLM layout as configured ({layout}): {' + '.join(VLLM_RULES)} {vllm_now:.1f} GPU-hours")
        lines.append(f"with one engine per GPU instead (tensor_parallel_size 1, data_parallel_size = gpus.generate; "
                     f"every paper model fits one H100): {vllm_dp:.1f} GPU-hours, total {total_dp:.1f} "
                     f"({total_dp / 4:.0f} hours of 4xH100 nodes)")
    lines.append("assumptions (docs/cluster.md; override with --assume KEY=VALUE): "
                 + ", ".join(f"{k}={v:g}" for k, v in a.items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m pwopsd.cost", description=__doc__.split("\n\n")[0])
    ap.add_argument("targets", nargs="*", help="Snakemake targets (default: the whole workflow)")
    ap.add_argument("--directory", default=".", help="working directory holding config/config.yaml (default .)")
    ap.add_argument("--all", action="store_true", help="count every job, also those whose outputs exist")
    ap.add_argument("--assume", action="append", default=[], metavar="KEY=VALUE", help="override an assumption")
    ap.add_argument("--configfile", action="append", default=[], help="an overlay config file, as snakemake --configfile "
                    "(e.g. config/seeds.yaml), relative to --directory; repeatable")
    ap.add_argument("--profile", default=None, help="the Slurm profile file whose runtimes and warnings are priced "
                    f"(default: this repository's {PROFILE})")
    args = ap.parse_args(argv)
    overlays = [str((Path(args.directory) / f).resolve()) for f in args.configfile]  # as Snakemake would, from any cwd
    cfg = load_config_files([Path(args.directory) / "config" / "config.yaml", *overlays])
    a = assumptions(cfg)  # with the config's cluster.cost_assumptions (e.g. a fitted overlay)
    for item in args.assume:
        key, _, value = item.partition("=")
        if key not in a:
            ap.error(f"unknown assumption {key!r} (known: {', '.join(a)})")
        a[key] = float(value)
    jobs = dry_run_jobs(args.directory, args.targets, forceall=args.all, configfiles=overlays)
    profile = Profile.from_file(args.profile)
    print(render(plan(jobs, cfg, a, profile), a, data_parallel=plan(jobs, data_parallel_layout(cfg), a, profile), cfg=cfg,
                 profile=profile))


if __name__ == "__main__":
    main()
