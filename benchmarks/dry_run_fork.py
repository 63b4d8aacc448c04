"""What a test's Snakemake dry run costs started as ``python -m snakemake -n`` against forked from
the fork server that imported Snakemake once (``tests/dry_runs.py``, how the test suite runs them).

A dry run of the paper's Table 2 (``-n results/tables/main_4b.tex`` on ``config/config.yaml``) each
way, ``--repeats`` times interleaved; CPU-seconds (user + system of the run's process and its
children: ``resource.getrusage`` of the reaped subprocess, the forked child's own account of itself)
and wall seconds; the minimum of each and their ratio. The fork server's one start (its import of
Snakemake) is made before the timings and printed apart.

    python benchmarks/dry_run_fork.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
import dry_runs  # noqa: E402

ARGS = ["-s", str(REPO / "Snakefile"), "-n", "results/tables/main_4b.tex"]


def command() -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "snakemake", *ARGS], cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, wall


def forked() -> tuple[float, float]:
    before = dry_runs.CPU_SECONDS[0]
    start = time.perf_counter()
    proc = dry_runs.run(ARGS, cwd=REPO, env=dict(os.environ))
    wall = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr[-2000:]
    return dry_runs.CPU_SECONDS[0] - before, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if args.repeats < 5:
        ap.error("--repeats: at least 5 (a single timing on a shared host can be off by 3x)")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    forked()  # starts the fork server (its import of Snakemake), outside the timings
    print(f"fork server's start and first dry run: {time.perf_counter() - start:.2f} s wall")
    runs: dict[str, list[tuple[float, float]]] = {"python -m snakemake": [], "forked": []}
    for _ in range(args.repeats):
        runs["python -m snakemake"].append(command())
        runs["forked"].append(forked())
    best = {name: (min(c for c, _ in r), min(w for _, w in r)) for name, r in runs.items()}
    print(f"snakemake -n results/tables/main_4b.tex (paper config), minimum of {args.repeats} interleaved runs each")
    for name, (cpu, wall) in best.items():
        print(f"  {name:<20} CPU {cpu:5.2f} s   wall {wall:5.2f} s")
    (cc, cw), (fc, fw) = best["python -m snakemake"], best["forked"]
    print(f"  forked / command: CPU {fc / cc:.2f}x, wall {fw / cw:.2f}x")


if __name__ == "__main__":
    main()
