"""Where a finished workflow run spent its time: per rule, and along the critical path.

Reads a run's ``benchmark:`` files (``logs/benchmarks/**/*.tsv``: wall seconds ``s`` and
``cpu_time`` of each job) and Snakemake's job records (``.snakemake/metadata``: each output's rule,
inputs, log and start/end time), then prints

1. per rule: jobs, wall seconds summed over its jobs, share of all job-seconds, CPU seconds;
2. the critical path: the chain of jobs, each reading an output of the one before, whose summed
   wall seconds are largest (the run's length with unlimited cores), next to the run's span (first
   start to last end) and the total job-seconds divided by the cores (its length with no idle core);
3. the realised path: from the job that ended last, back through the input whose producer ended
   last (what the run actually waited on, queueing for cores included).

A job's benchmark file and its log share their path below ``logs/`` (``logs/benchmarks/X.tsv`` ->
``logs/X.log``), as every rule of this workflow declares them; a job without a benchmark file
falls back to its recorded start and end.

    python benchmarks/workflow_profile.py tiny [--cores 2] [--top 25]
"""

from __future__ import annotations

import argparse
import base64
import csv
import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Job:
    rule: str
    log: str
    outputs: list[str] = field(default_factory=list)
    inputs: set[str] = field(default_factory=set)
    start: float = 0.0
    end: float = 0.0
    seconds: float = 0.0
    cpu_seconds: float | None = None

    @property
    def name(self) -> str:
        return self.log.removeprefix("logs/").removesuffix(".log") if self.log else self.outputs[0]


def read_benchmark(path: Path) -> tuple[float, float | None]:
    """(wall seconds, CPU seconds) of a Snakemake benchmark file (first repeat)."""
    with open(path) as fh:
        row = next(csv.DictReader(fh, delimiter="\t"))
    cpu = row.get("cpu_time")
    return float(row["s"]), (float(cpu) if cpu not in (None, "", "NA") else None)


def read_jobs(workdir: Path) -> list[Job]:
    """The run's jobs from its metadata records (one per output file, grouped by log file)."""
    meta = workdir / ".snakemake" / "metadata"
    if not meta.is_dir():
        raise SystemExit(f"{meta}: no Snakemake job records (is {workdir} a finished run's working directory?)")
    jobs: dict[str, Job] = {}
    for record in meta.iterdir():
        try:
            output = base64.b64decode(record.name.replace("@", "/") + "==").decode()
            data = json.loads(record.read_text())
        except (ValueError, UnicodeDecodeError):
            continue
        if data.get("incomplete") or data.get("starttime") is None:
            continue
        log = (data.get("log") or [""])[0]
        key = log or f"{data['rule']}:{data.get('job_hash')}"
        job = jobs.setdefault(key, Job(rule=data["rule"], log=log, start=data["starttime"], end=data["endtime"]))
        job.outputs.append(output)
        job.inputs |= set(data.get("input") or [])
        job.start, job.end = min(job.start, data["starttime"]), max(job.end, data["endtime"])
    for job in jobs.values():
        bench = workdir / "logs" / "benchmarks" / Path(job.log).relative_to("logs").with_suffix(".tsv") if job.log.startswith("logs/") else None
        if bench is not None and bench.is_file():
            job.seconds, job.cpu_seconds = read_benchmark(bench)
        else:
            job.seconds = job.end - job.start
    return list(jobs.values())


def producers(jobs: list[Job]) -> dict[str, Job]:
    """Output file (or a file below a directory output) -> the job that wrote it."""
    return {out: job for job in jobs for out in job.outputs}


def upstream(job: Job, made_by: dict[str, Job]) -> list[Job]:
    found = []
    for path in job.inputs:
        parent = made_by.get(path)
        while parent is None and "/" in path:  # a file inside a directory() output
            path = path.rsplit("/", 1)[0]
            parent = made_by.get(path)
        if parent is not None and parent is not job and parent not in found:
            found.append(parent)
    return found


def critical_path(jobs: list[Job]) -> list[Job]:
    """The dependency chain with the largest summed wall seconds."""
    made_by = producers(jobs)
    best: dict[int, tuple[float, list[Job]]] = {}

    def longest(job: Job) -> tuple[float, list[Job]]:
        if id(job) not in best:
            before = max((longest(p) for p in upstream(job, made_by)), key=lambda t: t[0], default=(0.0, []))
            best[id(job)] = (before[0] + job.seconds, before[1] + [job])
        return best[id(job)]

    sys.setrecursionlimit(max(1000, 4 * len(jobs)))
    return max((longest(j) for j in jobs), key=lambda t: t[0], default=(0.0, []))[1]


def realised_path(jobs: list[Job]) -> list[Job]:
    """From the last job to end, back through the input producer that ended last."""
    made_by = producers(jobs)
    job = max(jobs, key=lambda j: j.end)
    path = [job]
    while True:
        before = upstream(job, made_by)
        if not before:
            return path[::-1]
        job = max(before, key=lambda j: j.end)
        path.append(job)


def rule_table(jobs: list[Job]) -> list[tuple[str, int, float, float, float]]:
    """(rule, jobs, wall seconds, share of all job-seconds, CPU seconds) by descending wall seconds."""
    by_rule: dict[str, list[Job]] = defaultdict(list)
    for job in jobs:
        by_rule[job.rule].append(job)
    total = sum(j.seconds for j in jobs) or 1.0
    rows = [(rule, len(js), sum(j.seconds for j in js), sum(j.seconds for j in js) / total,
             sum(j.cpu_seconds or 0.0 for j in js)) for rule, js in by_rule.items()]
    return sorted(rows, key=lambda r: -r[2])


def report(workdir: Path, cores: int, top: int) -> str:
    jobs = read_jobs(workdir)
    if not jobs:
        raise SystemExit(f"{workdir}: no finished jobs recorded")
    total = sum(j.seconds for j in jobs)
    span = max(j.end for j in jobs) - min(j.start for j in jobs)
    lines = [f"{len(jobs)} jobs; span {span:.0f} s (first start to last end); job-seconds {total:.0f} "
             f"(/{cores} cores = {total / cores:.0f} s)", "",
             f"{'rule':<28}{'jobs':>5}{'wall s':>9}{'share':>8}{'cpu s':>9}{'s/job':>8}"]
    for rule, n, secs, share, cpu in rule_table(jobs)[:top]:
        lines.append(f"{rule:<28}{n:>5}{secs:>9.1f}{share:>8.1%}{cpu:>9.1f}{secs / n:>8.1f}")
    for title, path in (("critical path (dependencies only, unlimited cores)", critical_path(jobs)),
                        ("realised path (what the last job waited on)", realised_path(jobs))):
        lines += ["", f"{title}: {sum(j.seconds for j in path):.0f} s of job time"]
        for job in path:
            lines.append(f"  {job.seconds:>7.1f} s  {job.rule:<22} {job.name}")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workdir", type=Path, help="the run's working directory (e.g. tiny)")
    ap.add_argument("--cores", type=int, default=2, help="cores the run had (for the no-idle bound)")
    ap.add_argument("--top", type=int, default=30, help="rules to list")
    args = ap.parse_args(argv)
    print(report(args.workdir, args.cores, args.top))


if __name__ == "__main__":
    main()
