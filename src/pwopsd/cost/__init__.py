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
from pathlib import Path

from pwopsd.cluster import PROFILE, Profile
from pwopsd.config import load_config_files
from pwopsd.cost.hours import (  # noqa: F401  (the package's names, as before the split)
    ASSUMPTIONS,
    GPU_HOURS,
    Job,
    assumptions,
    data_parallel_layout,
    dry_run_jobs,
    job_hours,
    max_runtime,
    model_size_b,
    parse_dry_run,
    slurm_comment,
    train_step_seconds,
    training_jobs,
)
from pwopsd.cost.windows import (  # noqa: F401
    NOTICE_KINDS,
    NoticeWork,
    attempt_limits,
    attempts_needed,
    cap_problems,
    needed_window,
    notice_work,
    render_windows,
    rule_attempts,
    shard_sizes,
    train_retries,
    usable_minutes,
    warning_seconds,
    window_problems,
)


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


# Rules whose GPUs run vLLM engines (the layout comparison re-prices these).
VLLM_RULES = ("generate", "spines", "forced_continuation")


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
