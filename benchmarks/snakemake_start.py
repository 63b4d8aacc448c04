"""What one start of this workflow's Snakemake costs with the code params read back from
``.snakemake/pwopsd/code_digests.json`` (``pwopsd.script_digests``) against computing them again,
as every start did before: a dry run of the tiny configuration (``snakemake -n``, the DAG of 117
jobs), the cost a user pays for each dry run, and a cluster pays for each job (every Slurm job
starts Snakemake on the workflow again).

CPU-seconds (user + system of the snakemake process, ``resource.getrusage``) and wall seconds of
each, ``--repeats`` times interleaved (the cache file removed before each run without it); the
minimum of each and their ratio are printed. (It removes the checkout's cache file; the next start
writes it again.)

    python benchmarks/snakemake_start.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".snakemake" / "pwopsd" / "code_digests.json"


def dry_run(workdir: Path) -> tuple[float, float]:
    """One ``snakemake -n`` in ``workdir``: (CPU-seconds, wall seconds)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-n", "--quiet", "all",
                    "--directory", str(workdir)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if args.repeats < 5:
        ap.error("--repeats: at least 5 (a single timing on a shared host can be off by 3x)")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shutil.copytree(REPO / "tiny" / "config", work / "config")
        dry_run(work)  # Snakemake's own first-start work (its folders), outside the timings
        runs: dict[str, list[tuple[float, float]]] = {"parsed": [], "read back": []}
        for _ in range(args.repeats):
            CACHE.unlink(missing_ok=True)
            runs["parsed"].append(dry_run(work))
            assert CACHE.exists(), "the Snakefile wrote no code-param cache"
            runs["read back"].append(dry_run(work))
    best = {name: (min(c for c, _ in r), min(w for _, w in r)) for name, r in runs.items()}
    print(f"snakemake -n on the tiny configuration, minimum of {args.repeats} interleaved runs each")
    for name, (cpu, wall) in best.items():
        print(f"  code params {name:<10} CPU {cpu:5.2f} s   wall {wall:5.2f} s")
    (pc, pw), (rc, rw) = best["parsed"], best["read back"]
    print(f"  read back / parsed: CPU {rc / pc:.2f}x, wall {rw / pw:.2f}x")


if __name__ == "__main__":
    main()
