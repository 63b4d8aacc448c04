"""The plan of a run: every job the targets need (Snakemake's dry run with ``--forceall``), which of
them Snakemake would run now (its dry run without, with its reasons), and which jobs each output
needs; cached under ``.snakemake/pwopsd`` by the content of what decides each."""

from __future__ import annotations

import hashlib
import json
import os
from base64 import urlsafe_b64encode
from dataclasses import asdict
from importlib.metadata import version
from pathlib import Path

from pwopsd import cost

REPO = Path(__file__).resolve().parents[3]
PLAN_DIR = Path(".snakemake") / "pwopsd"


def _plan_key(directory: Path, targets: list[str], configfiles: list[str]) -> str:
    """The plan's cache key: everything that decides the DAG of the targets with --forceall (the
    Snakefile, the rules, the config and its overlays, the targets)."""
    h = hashlib.sha256()
    files = [REPO / "Snakefile", *sorted((REPO / "workflow" / "rules").glob("*.smk")),
             REPO / "workflow" / "schemas" / "config.schema.yaml", Path(directory) / "config" / "config.yaml",
             *(Path(directory) / f for f in configfiles)]
    for path in files:
        h.update(str(path).encode() + b"\0" + (path.read_bytes() if path.exists() else b"<missing>") + b"\0")
    h.update(json.dumps([targets, configfiles, version("snakemake")]).encode())
    for src in sorted([*(REPO / "src" / "pwopsd").rglob("*.py"), *(REPO / "workflow" / "scripts").glob("*.py")]):  # what the Snakefile imports (paths, settings, runs)
        h.update(str(src.relative_to(REPO)).encode() + b"\0" + src.read_bytes())
    return h.hexdigest()[:20]


def plan_jobs(directory: Path, targets: list[str], configfiles: list[str] = ()) -> list[cost.Job]:
    """Every job the targets need (Snakemake's dry run with --forceall), cached under
    .snakemake/pwopsd by the content of what decides it."""
    directory = Path(directory)
    configfiles = [str((directory / f).resolve()) for f in configfiles]
    cache = directory / PLAN_DIR / f"plan-{_plan_key(directory, targets, configfiles)}.json"
    if cache.exists():
        return [cost.Job(**j) for j in json.loads(cache.read_text())]
    jobs = cost.dry_run_jobs(str(directory), targets, forceall=True, configfiles=configfiles)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps([asdict(j) for j in jobs]))
    tmp.replace(cache)
    return jobs


def to_run(directory: Path, targets: list[str], configfiles: list[str], plan: list[cost.Job]) -> dict[str, str]:
    """The jobs Snakemake would run now for the targets, key -> its reason: its own dry run, without
    --forceall (outputs a running job left incomplete count as to be made, as with the profile's
    ``rerun-incomplete``). Cached by what decides it: the plan's key and the state of every planned
    output (its time and size, Snakemake's incomplete mark); a finished job changes both."""
    directory = Path(directory)
    configfiles = [str((directory / f).resolve()) for f in configfiles]
    h = hashlib.sha256(_plan_key(directory, targets, configfiles).encode())
    for out in sorted({o for job in plan for o in job.output}):
        try:
            st = (directory / out).stat()
            h.update(f"{out}\0{st.st_mtime_ns}\0{st.st_size}\0{incomplete_marker(directory, out).exists()}\0".encode())
        except OSError:
            h.update(f"{out}\0-\0".encode())
    cache = directory / PLAN_DIR / f"to-run-{h.hexdigest()[:20]}.json"
    if cache.exists():
        return json.loads(cache.read_text())
    jobs = cost.dry_run_jobs(str(directory), targets, forceall=False, configfiles=configfiles, rerun_incomplete=True)
    out = {j.key: j.reason for j in jobs if j.rule != "all"}
    for old in cache.parent.glob("to-run-*.json"):  # one at a time: the next state makes a new one
        old.unlink(missing_ok=True)
    tmp = cache.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(out))
    tmp.replace(cache)
    return out


def file_closure(jobs: list[cost.Job]) -> dict[str, set[str]]:
    """For each output file of the plan, the keys of the jobs it needs (its producer and upstream)."""
    producer = {out: job for job in jobs for out in job.output}
    memo: dict[str, set[str]] = {}

    def needs(job: cost.Job) -> set[str]:
        if job.key in memo:
            return memo[job.key]
        memo[job.key] = {job.key}  # guards a cycle (none in a DAG)
        keys = {job.key}
        for f in job.input:
            if f in producer:
                keys |= needs(producer[f])
        memo[job.key] = keys
        return keys

    return {out: needs(job) for out, job in producer.items()}


def default_targets(jobs: list[cost.Job]) -> list[str]:
    """The tables, figures and report of the default target (rule all), else every final output."""
    for job in jobs:
        if job.rule == "all":
            shown = [f for f in job.input if f.startswith(("results/tables/", "results/figures/", "results/report/"))
                     and not f.endswith((".csv", ".json"))]
            return shown or list(job.input)
    used = {f for j in jobs for f in j.input}
    return [f for j in jobs for f in j.output if f not in used]



def incomplete_marker(directory: Path, output: str) -> Path:
    """Snakemake's mark of an output whose job started and has not finished
    (.snakemake/incomplete/<urlsafe base64 of the path>, split at 254 characters a part)."""
    b64 = urlsafe_b64encode(output.encode()).decode()
    parts = [b64[i:i + 254] for i in range(0, len(b64), 254)]
    return Path(directory, ".snakemake", "incomplete", *(["@" + p for p in parts[:-1]] + parts[-1:]))
