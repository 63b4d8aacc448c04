"""A run's Slurm jobs as Slurm's accounting records them (``sacct``), one record per run of a job:
a requeued job's earlier runs are records of their own (``sacct --duplicates``), state REQUEUED.

The executor plugin names each submission by its rule and wildcards in the job's comment
(pwopsd.cost.slurm_comment) and submits from the working directory; the records of a run are
those with its working directory, since its first invocation started.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from pwopsd.notice import EXIT_INTERRUPTED

FIELDS = ["JobIDRaw", "JobName", "Comment", "State", "ExitCode", "ElapsedRaw", "Submit", "Start", "End", "AllocTRES",
          "WorkDir", "Partition", "NodeList", "Timelimit"]

# A job in one of these has not ended.
ACTIVE_STATES = ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
                 "SIGNALING", "STAGE_OUT")

# A job that ends in one of these did not run to its end; what it means for the user.
FAILED_STATES = {"FAILED", "OUT_OF_MEMORY", "TIMEOUT", "CANCELLED", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
                 "REQUEUED"}


@dataclass
class SlurmAttempt:
    jobid: str
    comment: str
    state: str          # first word of sacct's State (CANCELLED by 0 -> CANCELLED)
    exit_code: str      # "75:0": the job's exit status and the signal that ended it
    seconds: float      # ElapsedRaw
    submit: float | None
    start: float | None
    end: float | None
    gpus: int
    partition: str
    node: str
    timelimit: str
    workdir: str

    @property
    def status(self) -> int | None:
        m = re.match(r"(\d+):(\d+)", self.exit_code)
        return int(m[1]) if m else None

    @property
    def signal(self) -> int | None:
        m = re.match(r"(\d+):(\d+)", self.exit_code)
        return int(m[2]) if m else None

    @property
    def stopped_on_notice(self) -> bool:
        """Exited with EXIT_INTERRUPTED (pwopsd.notice): a job whose script is its batch step. A job
        run by its own Snakemake exits 1 instead; its log says so (pwopsd.status.collect)."""
        return self.status == EXIT_INTERRUPTED


def _time(text: str) -> float | None:
    if not text or text in ("Unknown", "None"):
        return None
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))  # sacct prints local time
    except ValueError:
        return None


def gpus_of(tres: str) -> int:
    """GPUs of an AllocTRES entry (``...,gres/gpu=2,...``; the typed entry gres/gpu:h100=2 is the same GPUs)."""
    m = re.search(r"(?:^|,)gres/gpu=(\d+)", tres)
    return int(m[1]) if m else 0


def parse_sacct(text: str) -> list[SlurmAttempt]:
    """Records of ``sacct -P -n -X --format=<FIELDS>``: one per run of a job (steps left out)."""
    out = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != len(FIELDS):
            continue
        row = dict(zip(FIELDS, parts))
        if not row["JobIDRaw"] or "." in row["JobIDRaw"]:
            continue
        out.append(SlurmAttempt(row["JobIDRaw"], row["Comment"], (row["State"].split() or ["UNKNOWN"])[0],
                                row["ExitCode"], float(row["ElapsedRaw"] or 0), _time(row["Submit"]), _time(row["Start"]),
                                _time(row["End"]), gpus_of(row["AllocTRES"]), row["Partition"], row["NodeList"],
                                row["Timelimit"], row["WorkDir"]))
    return out


def available(env: dict | None = None) -> bool:
    return shutil.which("sacct", path=(env or {}).get("PATH")) is not None


def query(directory: Path, since: float, env: dict | None = None, logdirs=("logs/slurm",)) -> list[SlurmAttempt] | None:
    """The records of the jobs submitted from ``directory`` since ``since`` (epoch seconds), in
    submission order; None when there is no ``sacct`` or it fails (no accounting: say so, not 0)."""
    if not available(env):
        return None
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since - 60))
    try:
        proc = subprocess.run(["sacct", "-X", "-D", "-n", "-P", "-S", start, f"--format={','.join(FIELDS)}"],  # own jobs
                              capture_output=True, text=True, env=env, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    workdir = str(Path(directory).resolve())
    records = [r for r in parse_sacct(proc.stdout) if r.workdir.rstrip("/") == workdir]
    unnamed = {r.jobid for r in records if not r.comment}
    if unnamed:
        # The accounting stores a job's comment only with AccountingStoreFlags=job_comment, and then
        # only once the job ends: squeue has the comment of a queued or running job, and the
        # executor plugin's log tree (<logdir>/rule_<rule>/<wildcards>/<jobid>.log) names every job.
        names = {**comments_from_logs(directory, logdirs), **queue_comments(unnamed, env)}
        for r in records:
            if not r.comment:
                r.comment = names.get(r.jobid, "")
    return sorted(records, key=lambda r: (r.submit or 0.0, int(re.sub(r"\D", "", r.jobid) or 0)))


def comments_from_logs(directory: Path, logdirs=("logs/slurm",)) -> dict[str, str]:
    """Job id -> the executor plugin's comment, read from its log tree: ``rule_<rule>/<jobid>.log``
    for a job without wildcards, ``rule_<rule>/<wildcards>/<jobid>.log`` for one with."""
    out = {}
    for logdir in logdirs:
        root = Path(directory) / logdir
        for log in root.glob("rule_*/**/*.log") if root.is_dir() else []:
            parts = log.relative_to(root).parts
            if len(parts) == 2:
                out[log.stem] = parts[0]
            elif len(parts) == 3:
                out[log.stem] = f"{parts[0]}_wildcards_{parts[1]}"
    return out


def queue_comments(jobids, env: dict | None = None) -> dict[str, str]:
    """The comments of queued or running jobs, from ``squeue`` (job id -> comment)."""
    try:
        proc = subprocess.run(["squeue", "-h", "-a", "-j", ",".join(sorted(jobids)), "-o", "%i|%k"], capture_output=True,
                              text=True, env=env, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out = {}
    for line in proc.stdout.splitlines():
        jobid, _, comment = line.partition("|")
        if comment and comment != "(null)":
            out[jobid.strip()] = comment.strip()
    return out
