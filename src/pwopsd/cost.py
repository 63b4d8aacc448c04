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

from pwopsd.config import checkpoint_seed_names, diagnostic_settings, load_config, load_config_files, training_config

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
    "train_prompt_tokens": 600.0,
    # Model loading / engine start per job, minutes.
    "startup_min": 5.0,
}


@dataclass
class Job:
    rule: str
    wildcards: dict[str, str]
    gpus: int
    resources: dict[str, str] = field(default_factory=dict)
    threads: int = 1


def parse_dry_run(output: str) -> list[Job]:
    """The jobs of a ``snakemake -n`` listing: rule, wildcards, resources (as printed), GPUs, threads."""
    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", output):
        m = re.match(r"(?:local)?rule (\w+):", block)
        if not m:
            continue
        wc = re.search(r"^\s+wildcards: (.*)$", block, re.M)
        res = re.search(r"^\s+resources: (.*)$", block, re.M)
        threads = re.search(r"^\s+threads: (\d+)$", block, re.M)
        resources = dict(kv.split("=", 1) for kv in res.group(1).split(", ")) if res else {}
        jobs.append(Job(m.group(1), dict(kv.split("=", 1) for kv in wc.group(1).split(", ")) if wc else {},
                        int(resources.get("gpu", 0)), resources, int(threads.group(1)) if threads else 1))
    return jobs


def dry_run_jobs(directory: str, targets: list[str], *, forceall: bool, configfiles: list[str] = ()) -> list[Job]:
    """Jobs of ``snakemake -n`` for the targets (with the overlay ``configfiles``)."""
    repo = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "snakemake", "-s", str(repo / "Snakefile"), "-n", "--directory", directory, *targets]
    if configfiles:
        cmd += ["--configfile", *configfiles]
    if forceall:
        cmd.append("--forceall")
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
    return decode + fwd + a["train_step_overhead_s"]


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


def job_hours(job: Job, cfg: dict, a: dict = ASSUMPTIONS) -> float:
    """Estimated wall hours of one GPU job (0 for CPU jobs): start-up plus the rule's cost model."""
    if job.gpus == 0:
        return 0.0
    if job.rule not in GPU_HOURS:
        raise ValueError(f"rule {job.rule} asks for {job.gpus} GPUs but has no cost model in pwopsd.cost.GPU_HOURS")
    size = model_size_b(cfg, job.wildcards.get("model"))
    return a["startup_min"] / 60.0 + GPU_HOURS[job.rule](job, cfg, size, a)


def plan(jobs: list[Job], cfg: dict, a: dict = ASSUMPTIONS) -> list[dict]:
    """Per rule: jobs, GPUs a job, hours, GPU-hours, and the attempts its longest job needs under
    ``cluster.max_runtime_min`` (a job that stops at the limit resumes in the next attempt)."""
    cap = float(cfg.get("cluster", {}).get("max_runtime_min", math.inf))
    rows: dict[str, dict] = {}
    for job in jobs:
        h = job_hours(job, cfg, a)
        row = rows.setdefault(job.rule, {"rule": job.rule, "jobs": 0, "gpus": set(), "hours": 0.0, "gpu_hours": 0.0,
                                         "attempts": 1})
        row["attempts"] = max(row["attempts"], attempts_needed(h, cap, a))
        row["jobs"] += 1
        row["gpus"].add(job.gpus)
        row["hours"] += h
        row["gpu_hours"] += h * job.gpus
    return sorted(rows.values(), key=lambda r: (-r["gpu_hours"], r["rule"]))


def usable_minutes(cap_min: float, a: dict = ASSUMPTIONS) -> float:
    """Minutes of work an attempt capped at ``cap_min`` does: less its start-up and the notice
    window before the limit, in which it finishes its step and writes the checkpoint
    (:data:`pwopsd.notice.NOTICE_GRACE_SECONDS`)."""
    from pwopsd.notice import NOTICE_GRACE_SECONDS

    return cap_min - a["startup_min"] - NOTICE_GRACE_SECONDS / 60.0


def attempts_needed(hours: float, cap_min: float, a: dict = ASSUMPTIONS) -> int:
    """Attempts (submissions, each resuming from the last checkpoint) that a job of ``hours``
    (start-up included) needs when Slurm stops each attempt at ``cap_min`` minutes."""
    work = max(0.0, hours * 60.0 - a["startup_min"])
    usable = usable_minutes(cap_min, a)
    if usable <= 0:
        return 0  # never: cap_problems says why
    return max(1, math.ceil(work / usable - 1e-9))


def training_jobs(cfg: dict) -> list[Job]:
    """Every configured training run as the train rule's job (GPUs: the model's ``gpus.train``)."""
    from pwopsd.config import training_runs

    return [Job("train", {"model": model, "method": run}, int(cfg["models"][model]["gpus"]["train"]))
            for model, run in training_runs(cfg)]


def cap_problems(cfg: dict, a: dict = ASSUMPTIONS) -> list[str]:
    """Training runs that cannot progress under ``cluster.max_runtime_min``: an attempt must hold
    the start-up, one step and the notice window. One message per run, with the numbers."""
    from pwopsd.notice import NOTICE_GRACE_SECONDS

    cap = float(cfg["cluster"]["max_runtime_min"])
    problems = []
    for job in training_jobs(cfg):
        if job.gpus == 0:
            continue
        step = train_step_seconds(job, cfg, model_size_b(cfg, job.wildcards["model"]), a) / 60.0
        if usable_minutes(cap, a) < step:
            notice = NOTICE_GRACE_SECONDS / 60.0
            problems.append(f"cluster.max_runtime_min={cap:g} is too short for training {job.wildcards['model']}/"
                            f"{job.wildcards['method']}: an attempt needs {a['startup_min']:g} min start-up + "
                            f"{step:.1f} min for one step + {notice:g} min to checkpoint on notice = "
                            f"{a['startup_min'] + step + notice:.1f} min")
    return problems


def train_retries(cfg: dict, a: dict = ASSUMPTIONS, failures: int = 2) -> int:
    """The train rule's retries on a cluster: the attempts its longest run needs under
    ``cluster.max_runtime_min`` (each resumes from the checkpoint the previous one wrote on notice),
    beyond the first, plus ``failures`` for crashes, node failures and memory kills."""
    cap = float(cfg["cluster"]["max_runtime_min"])
    needed = [attempts_needed(job_hours(job, cfg, a), cap, a) for job in training_jobs(cfg) if job.gpus]
    return max(needed, default=1) - 1 + failures


# Rules whose GPUs run vLLM engines (the layout comparison re-prices these).
VLLM_RULES = ("generate", "spines", "forced_continuation")


def render(rows: list[dict], a: dict, data_parallel: list[dict] | None = None, cfg: dict | None = None) -> str:
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
        lines.append(f"attempts: submissions the longest job of a rule needs when each stops at cluster.max_runtime_min="
                     f"{cfg['cluster']['max_runtime_min']} min and the next resumes from its checkpoint (train: "
                     f"retries {train_retries(cfg, a)} on the cluster)")
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
    args = ap.parse_args(argv)
    a = dict(ASSUMPTIONS)
    for item in args.assume:
        key, _, value = item.partition("=")
        if key not in a:
            ap.error(f"unknown assumption {key!r} (known: {', '.join(a)})")
        a[key] = float(value)
    cfg = load_config_files([Path(args.directory) / "config" / "config.yaml",
                             *(Path(args.directory) / f for f in args.configfile)])
    jobs = dry_run_jobs(args.directory, args.targets, forceall=args.all, configfiles=args.configfile)
    print(render(plan(jobs, cfg, a), a, data_parallel=plan(jobs, data_parallel_layout(cfg), a), cfg=cfg))


if __name__ == "__main__":
    main()
