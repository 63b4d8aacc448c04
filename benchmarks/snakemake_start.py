"""What one start of this workflow's Snakemake costs: a dry run of the tiny configuration
(``snakemake -n``, the DAG of 117 jobs), the cost a user pays for each dry run, and a cluster pays
for each job (every Slurm job starts Snakemake on the workflow again).

- with the code params read back from ``.snakemake/pwopsd/code_digests.json``
  (``pwopsd.script_digests``) against computing them again, as every start did before (the cache
  file removed before each run without it; the next start writes it again);
- ``--forked``: started as ``python -m snakemake`` against forked from the fork server that has
  imported Snakemake once (``tests/dry_runs.py``, how the test suite runs its dry runs; the fork
  server's start is made before the timings).

CPU-seconds (user + system of the run's process and its children: ``resource.getrusage`` of the
reaped subprocess, the forked child's own account of itself) and wall seconds of each,
``--repeats`` times interleaved; the minimum of each and their ratio are printed.

    python benchmarks/snakemake_start.py [--forked] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".snakemake" / "pwopsd" / "code_digests.json"
sys.path.insert(0, str(REPO / "tests"))
import dry_runs  # noqa: E402  (the test suite's fork server of dry runs)


def _args(workdir: Path) -> list[str]:
    return ["-s", str(REPO / "Snakefile"), "-n", "--quiet", "all", "--directory", str(workdir)]


def dry_run(workdir: Path) -> tuple[float, float]:
    """One ``python -m snakemake -n`` in ``workdir``: (CPU-seconds, wall seconds)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "snakemake", *_args(workdir)], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, wall


def forked_dry_run(workdir: Path) -> tuple[float, float]:
    """The same dry run forked from the test suite's fork server (tests/dry_runs.py)."""
    before = dry_runs.CPU_SECONDS[0]
    start = time.perf_counter()
    proc = dry_runs.run(_args(workdir), cwd=REPO, env=dict(os.environ))
    wall = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr[-2000:]
    return dry_runs.CPU_SECONDS[0] - before, wall


def report(runs: dict[str, list[tuple[float, float]]], what: str) -> None:
    """The minimum CPU and wall seconds of each way, and the second's ratio to the first's."""
    best = {name: (min(c for c, _ in r), min(w for _, w in r)) for name, r in runs.items()}
    print(f"snakemake -n on the tiny configuration, minimum of {len(next(iter(runs.values())))} interleaved runs each")
    for name, (cpu, wall) in best.items():
        print(f"  {what} {name:<20} CPU {cpu:5.2f} s   wall {wall:5.2f} s")
    (first, (c1, w1)), (second, (c2, w2)) = best.items()
    print(f"  {second} / {first}: CPU {c2 / c1:.2f}x, wall {w2 / w1:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--forked", action="store_true", help="a command's start against a dry run forked from the fork server")
    args = ap.parse_args()
    if args.repeats < 5:
        ap.error("--repeats: at least 5 (a single timing on a shared host can be off by 3x)")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shutil.copytree(REPO / "tiny" / "config", work / "config")
        dry_run(work)  # Snakemake's own first-start work (its folders, the code-param cache), outside the timings
        if args.forked:
            forked_dry_run(work)  # the fork server's start
            runs: dict[str, list[tuple[float, float]]] = {"python -m snakemake": [], "forked": []}
            for _ in range(args.repeats):
                runs["python -m snakemake"].append(dry_run(work))
                runs["forked"].append(forked_dry_run(work))
            return report(runs, "started as")
        runs = {"parsed": [], "read back": []}
        for _ in range(args.repeats):
            CACHE.unlink(missing_ok=True)
            runs["parsed"].append(dry_run(work))
            assert CACHE.exists(), "the Snakefile wrote no code-param cache"
            runs["read back"].append(dry_run(work))
        report(runs, "code params")


if __name__ == "__main__":
    main()
