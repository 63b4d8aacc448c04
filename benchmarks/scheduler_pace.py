"""What Snakemake's own process costs in CPU-seconds with its default job pace (``100/1s``) and with
the pace ``profiles/default/profile.yaml`` sets, on a workflow shaped like the tiny run's: many
short jobs with shared inputs that wait for 2 cores (docs/decisions.md, "Snakemake's scheduler").

Why it matters: with a job rate limit, Snakemake's scheduler arms a timer after every selection
round to look again once the limit's timespan has passed; each finished job starts a round, so each
starts a timer chain that lives as long as jobs are waiting for cores. Rounds per second grow with
the jobs finished, and each round sizes every waiting job's inputs. The longer timespan makes the
rounds that many times rarer.

The jobs only sleep, so what is measured is Snakemake's work (user + system CPU of the snakemake
process and its children, from ``resource.getrusage``), not the wall time, which sleeping jobs and
a shared host move. Each pace runs ``--repeats`` times, interleaved; the minimum of each is printed
with its ratio to the default's.

    python benchmarks/scheduler_pace.py                   # --jobs 80 --inputs 30 --sleep 1 --repeats 5
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

import yaml

REPO = Path(__file__).resolve().parents[1]
SNAKEFILE = """
rule all:
    input: expand("out/{{i}}.txt", i=range({jobs}))
rule data:
    output: "data/{{k}}.txt"
    shell: "echo {{wildcards.k}} > {{output}}"
rule job:
    input: expand("data/{{k}}.txt", k=range({inputs}))
    output: "out/{{i}}.txt"
    params: twice=lambda w: int(w.i) * 2
    threads: 1
    shell: "sleep {sleep}; echo {{params.twice}} > {{output}}"
"""


def project_pace() -> str:
    return yaml.safe_load((REPO / "profiles" / "default" / "profile.yaml").read_text())["max-jobs-per-timespan"]


def run(workdir: Path, pace: str) -> tuple[float, float]:
    """One run of the workflow from scratch at ``pace``: (CPU-seconds of snakemake and its jobs, wall s)."""
    for sub in ("out", "data", ".snakemake"):
        shutil.rmtree(workdir / sub, ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--quiet", "all", "--workflow-profile", "none",
                    "--max-jobs-per-timespan", pace], cwd=workdir, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=80)
    ap.add_argument("--inputs", type=int, default=30)
    ap.add_argument("--sleep", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    paces = {"Snakemake's default": "100/1s", "this project's profile": project_pace()}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "Snakefile").write_text(SNAKEFILE.format(jobs=args.jobs, inputs=args.inputs, sleep=args.sleep))
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in paces}
        for _ in range(args.repeats):
            for name, pace in paces.items():  # interleaved
                results[name].append(run(work, pace))
    base = min(cpu for cpu, _ in results["Snakemake's default"])
    print(f"{args.jobs} jobs of {args.sleep} s on 2 cores, {args.inputs} shared inputs each; "
          f"minimum of {args.repeats} interleaved runs")
    for name, pace in paces.items():
        cpu = min(c for c, _ in results[name])
        wall = min(w for _, w in results[name])
        print(f"{name:24s} {pace:>8s}  CPU {cpu:6.2f} s  ({cpu / base:.2f}x)  wall {wall:6.1f} s")


if __name__ == "__main__":
    main()
