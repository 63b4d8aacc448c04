"""The status of a run: the plan (Snakemake's DAG for the targets, priced by pwopsd.cost) joined
with what happened (the logger plugin's events, Slurm's accounting, the ``benchmark:`` files and
the outputs on disk).

Each planned job is ``done`` (its outputs exist, no attempt is open and Snakemake would not run it
again), ``running``, ``queued`` (submitted, waiting in Slurm's queue), ``failed`` (its last attempt
failed and none followed yet) or ``waiting`` (not started: its inputs are not all there, Snakemake has
not reached it, or Snakemake will make it again: ``rerun`` holds its reason, say a changed config or
code). Which jobs Snakemake will run comes from Snakemake itself: a dry run without ``--forceall``.
"""

from __future__ import annotations

import math
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pwopsd import cost
from pwopsd.notice import EXIT_INTERRUPTED
from pwopsd.status import events as ev
from pwopsd.status import slurm
from pwopsd.status.plan import default_targets, file_closure, incomplete_marker, plan_jobs, to_run

STATES = ("done", "running", "queued", "failed", "waiting")
TAIL_LINES = 6


@dataclass
class Attempt:
    number: int                 # 1, 2, ...: submissions of the job, requeues included
    state: str                  # COMPLETED, RUNNING, PENDING, FAILED, OUT_OF_MEMORY, REQUEUED, ... (local: the same words)
    seconds: float | None       # wall seconds (Slurm: ElapsedRaw; local: benchmark file, else the events)
    gpus: int
    start: float | None
    end: float | None
    slurm_jobid: str | None = None
    exit_code: str | None = None
    reason: str = ""            # why it ended early, in words
    log: str | None = None      # the log whose tail is shown
    log_tail: list[str] = field(default_factory=list)
    resubmitted_after_notice: bool = False  # this attempt follows one stopped on notice or requeued


@dataclass
class JobStatus:
    key: str
    rule: str
    wildcards: dict
    model: str
    gpus: int
    planned_gpu_hours: float | None  # None: the cost model cannot price it (a GPU rule of an unsized model)
    state: str
    attempts: list[Attempt]
    output: list[str]
    job: cost.Job | None = None  # the planned job (what the cost model prices)
    rerun: str = ""              # outputs there, yet Snakemake will make them again: its reason

    @property
    def spent_seconds(self) -> float:
        return sum(a.seconds or 0.0 for a in self.attempts)

    @property
    def spent_gpu_hours(self) -> float:
        return sum((a.seconds or 0.0) * a.gpus for a in self.attempts) / 3600.0


@dataclass
class Status:
    directory: str
    targets: list[str]
    jobs: list[JobStatus]
    target_jobs: dict[str, list[str]]        # target file -> keys of the jobs it needs
    accounting: str                          # "sacct", "benchmark files" or "events"
    invocations: list[dict]
    taken: float = field(default_factory=time.time)

    def counts(self, keys=None) -> dict[str, int]:
        wanted = None if keys is None else set(keys)
        out = dict.fromkeys(STATES, 0)
        for job in self.jobs:
            if wanted is None or job.key in wanted:
                out[job.state] += 1
        return out

    def by_key(self) -> dict[str, JobStatus]:
        return {j.key: j for j in self.jobs}

    def failures(self) -> list[tuple[JobStatus, Attempt]]:
        """Every attempt that ended early (failures, notice stops, requeues), oldest first."""
        out = [(j, a) for j in self.jobs for a in j.attempts if a.reason]
        return sorted(out, key=lambda ja: ja[1].start or ja[1].end or 0.0)

    def resubmissions_after_notice(self) -> int:
        return sum(a.resubmitted_after_notice for j in self.jobs for a in j.attempts)

    def spend(self, done_only: bool = False) -> list[dict]:
        """Per rule and model: jobs, done, planned and spent GPU-hours, spent job-seconds, the plan of
        the jobs not done yet (``done_only``: of the finished jobs alone, the plan checked against
        what it cost)."""
        rows: dict[tuple[str, str], dict] = {}
        for job in self.jobs:
            if done_only and job.state != "done":
                continue
            row = rows.setdefault((job.rule, job.model), {
                "rule": job.rule, "model": job.model, "jobs": 0, "done": 0, "gpus": job.gpus, "planned_gpu_hours": 0.0,
                "spent_gpu_hours": 0.0, "spent_seconds": 0.0, "remaining_gpu_hours": 0.0, "attempts": 0, "priced": True})
            row["jobs"] += 1
            row["done"] += job.state == "done"
            row["attempts"] += len(job.attempts)
            row["spent_seconds"] += job.spent_seconds
            row["spent_gpu_hours"] += job.spent_gpu_hours
            if job.planned_gpu_hours is None:
                row["priced"] = False
                continue
            row["planned_gpu_hours"] += job.planned_gpu_hours
            if job.state != "done":
                row["remaining_gpu_hours"] += job.planned_gpu_hours
        return sorted(rows.values(), key=lambda r: (-r["planned_gpu_hours"], -r["spent_seconds"], r["rule"], r["model"]))

    def estimate(self) -> dict:
        """The plan left and the time it may take: the remaining plan scaled by how far the finished
        GPU jobs ran from their plan (spent / planned), over the GPUs the running jobs hold."""
        done = [j for j in self.jobs if j.state == "done" and j.gpus and j.planned_gpu_hours]
        planned_done = sum(j.planned_gpu_hours for j in done)
        ratio = sum(j.spent_gpu_hours for j in done) / planned_done if planned_done else None
        remaining = sum(j.planned_gpu_hours or 0.0 for j in self.jobs if j.state != "done")
        gpus_now = sum(j.gpus for j in self.jobs if j.state == "running")
        corrected = remaining * ratio if ratio is not None else remaining
        hours_left = corrected / gpus_now if gpus_now else None
        return {"planned_gpu_hours": sum(j.planned_gpu_hours or 0.0 for j in self.jobs),
                "spent_gpu_hours": sum(j.spent_gpu_hours for j in self.jobs),
                "spent_seconds": sum(j.spent_seconds for j in self.jobs),
                "remaining_planned_gpu_hours": remaining, "spent_over_planned": ratio,
                "remaining_corrected_gpu_hours": corrected, "gpus_running": gpus_now, "hours_left": hours_left}

    def to_json(self) -> dict:
        out = asdict(self)
        out["counts"] = self.counts()
        out["spend"] = self.spend()
        out["estimate"] = self.estimate()
        return out


# -- joining -------------------------------------------------------------------------------------

# Terminal colours (ANSI escapes) and other control characters of a log, left out of its lines.
CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|[\x00-\x08\x0b-\x1f\x7f]")


# Log lines that name why a job ended: Slurm's step daemon (memory, time limit, cancel), the kernel's
# OOM killer, a job stopped on notice.
CAUSE = re.compile(r"slurmstepd|oom-kill|out of memory|exceeded .*memory limit|pwopsd job stopped on notice|DUE TO TIME LIMIT",
                   re.I)


def read_end(path: Path, size: int = 16384) -> str:
    """The last ``size`` bytes of a log ('' when it cannot be read)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - size))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def tail(path: Path, lines: int = TAIL_LINES) -> list[str]:
    """A log's last lines that say something: those before the error block a job's own Snakemake
    prints when its job fails (from its first "Error in rule ...": where to look, the shutdown), when
    there is one."""
    text = CONTROL.sub("", read_end(path))
    kept = [line.rstrip() for line in text.splitlines() if line.strip()]
    block = next((i for i, line in enumerate(kept) if line.startswith("Error in rule ")), None)
    before = kept[:block] if block else kept
    last = before[-lines:]
    # The lines that say why (Slurm's kill, a notice), when more lines came after them: first.
    why = [line for line in before[:-lines] if CAUSE.search(line)][-3:]
    return why + last


# What a job's Slurm log says when its script stopped on notice (pwopsd.notice.exit_on_notice, and
# the job's own Snakemake, which exits 1 whatever its script's status).
NOTICE_LINES = ("pwopsd job stopped on notice:", f"returned non-zero exit status {EXIT_INTERRUPTED}.")


def stopped_on_notice(att: slurm.SlurmAttempt, log_text: str) -> bool:
    """Whether a Slurm job stopped on notice: warned (its time limit, a preemption) or told to stop,
    it saved its work and exited for the next attempt to resume."""
    return att.stopped_on_notice or any(line in log_text for line in NOTICE_LINES)


def slurm_reason(att: slurm.SlurmAttempt, log_text: str) -> str:
    """Why a Slurm job ended early, in words ('' for a job that completed or still runs); ``log_text``:
    the end of its Slurm log, where slurmstepd says why it killed a step and a job says it stopped
    on notice."""
    text = log_text.lower()
    if att.state == "REQUEUED":
        return "requeued by Slurm (preemption, node failure or scontrol requeue)"
    if stopped_on_notice(att, log_text):
        return (f"stopped on notice: its script saved its work and exited {EXIT_INTERRUPTED} for the next attempt "
                f"(Slurm state {att.state}, exit {att.exit_code})")
    if att.state == "PREEMPTED":
        return "preempted"
    if att.state == "OUT_OF_MEMORY" or "exceeded job memory limit" in text or "oom-kill" in text or "oom_kill" in text:
        return f"out of memory (Slurm state {att.state}, exit {att.exit_code}, time limit {att.timelimit})"
    if att.state == "TIMEOUT":
        return f"reached its time limit {att.timelimit}"
    if att.state in slurm.FAILED_STATES:
        return f"{att.state.lower().replace('_', ' ')}, exit {att.exit_code}"
    return ""


def slurm_log(directory: Path, att: slurm.SlurmAttempt, rule: str, wildcards: dict, logdirs: list[str]) -> Path | None:
    """The Slurm log of a job (the executor plugin's <logdir>/rule_<rule>/<wildcards>/<jobid>.log)."""
    wc = "_".join(str(v) for v in wildcards.values()).replace("/", "_")
    for logdir in logdirs:
        path = Path(directory) / logdir / f"rule_{rule}" / wc / f"{att.jobid}.log"
        if path.exists():
            return path
    return None


def _benchmark_seconds(path: Path) -> float | None:
    try:
        lines = path.read_text().splitlines()
        return float(dict(zip(lines[0].split("\t"), lines[1].split("\t")))["s"])
    except (OSError, IndexError, KeyError, ValueError):
        return None


def _slurm_attempts(directory, job, records, logdirs) -> list[Attempt]:
    out = []
    previous = False
    for i, rec in enumerate(records, start=1):
        # A requeued job's runs share its job id, and so its log (which Slurm starts again, or appends
        # to): the log is the latest run's; an earlier run's reason is its state's.
        latest = all(later.jobid != rec.jobid for later in records[i:])
        logpath = slurm_log(directory, rec, job.rule, job.wildcards, logdirs) if latest else None
        lines = tail(logpath) if logpath else []
        text = read_end(logpath) if logpath else ""
        reason = "" if rec.state in ("COMPLETED", *slurm.ACTIVE_STATES) else slurm_reason(rec, text)
        out.append(Attempt(i, rec.state, rec.seconds, rec.gpus, rec.start, rec.end, rec.jobid, rec.exit_code, reason,
                           str(logpath.relative_to(directory)) if logpath else None, lines if reason else [],
                           resubmitted_after_notice=previous))
        # the next attempt resumes: this one stopped on notice or was requeued
        previous = rec.state in ("REQUEUED", "PREEMPTED") or (bool(reason) and stopped_on_notice(rec, text))
    return out


def _made(directory: Path, job: cost.Job, start: float) -> bool:
    """Whether ``job``'s outputs were made since ``start``: they all exist, written since, and
    Snakemake no longer marks them incomplete (it does from a job's start to its end)."""
    try:
        return bool(job.output) and all((directory / o).stat().st_mtime >= start - 1 and
                                        not incomplete_marker(directory, o).exists() for o in job.output)
    except OSError:
        return False


def _local_attempts(directory, job, attempts: list[ev.LocalAttempt], have_sacct: bool) -> list[Attempt]:
    out = []
    for i, la in enumerate(attempts, start=1):
        last = i == len(attempts)
        ok = la.ok
        cut_off = la.cut_off or (ok is None and not last)  # a later attempt of the job began: this one was cut off
        if ok is None and last and _made(directory, job, la.start):
            ok = True  # Snakemake logs no job's end with --quiet progress: the outputs say it finished
        if ok:
            state = "COMPLETED"
        elif ok is False:
            state = "FAILED"
        elif cut_off:
            state = "CANCELLED"
        elif la.local:
            state = "RUNNING"
        else:  # submitted to the cluster: not yet in its accounting, or no accounting to ask here
            state = "PENDING" if have_sacct else "SUBMITTED"
        seconds = la.seconds
        if ok and last and la.benchmark:  # the benchmark file is the last making's
            seconds = _benchmark_seconds(Path(directory) / la.benchmark[0]) or seconds
        if state in ("RUNNING", "SUBMITTED"):
            seconds = time.time() - la.start
        elif state == "PENDING" or (state == "CANCELLED" and seconds is None):
            seconds = None
        reason = ""
        lines: list[str] = []
        log = None
        if state in ("FAILED", "CANCELLED"):
            reason = "Snakemake stopped while it ran" if cut_off else (la.msg.strip().splitlines() or ["exited with an error"])[0]
            for name in la.log:
                lines = tail(Path(directory) / name)
                if lines:
                    log = name
                    break
        out.append(Attempt(i, state, seconds, job.gpus, la.start, la.end, None, None, reason, log, lines))
    return out


def _normalise(directory: Path, target: str) -> str:
    """A target as the plan names files: relative to the working directory, no ./ or trailing /."""
    path = Path(target)
    if path.is_absolute():
        try:
            path = path.resolve().relative_to(directory)
        except ValueError:
            return target
    return os.path.normpath(str(path))


def _target_jobs(directory: Path, plan: list[cost.Job], targets: list[str]) -> dict[str, list[str]]:
    """Each target's jobs: a file's producer and everything upstream; a rule name (``all``,
    ``train_all``): its jobs' inputs, and theirs."""
    closure = file_closure(plan)
    out = {}
    for target in targets:
        name = _normalise(directory, target)
        keys = set(closure.get(name, set()))
        if not keys and "/" not in name:
            for job in plan:
                if job.rule == name:
                    keys.add(job.key)
                    for f in job.input:
                        keys |= closure.get(f, set())
        out[target] = sorted(keys)
    return out


def collect(directory: Path | str, targets: list[str] | None = None, configfiles: list[str] = (),
            cfg: dict | None = None, env: dict | None = None, slurm_logdirs: list[str] = ("logs/slurm",)) -> Status:
    """The status of the run in ``directory`` for ``targets`` (default: the tables, figures and
    report of the whole workflow)."""
    from pwopsd.config import load_config_files

    directory = Path(directory).resolve()
    targets = [_normalise(directory, t) for t in targets or []]
    full_plan = plan_jobs(directory, targets, list(configfiles))
    plan = [j for j in full_plan if j.rule != "all" or "all" in targets]
    if cfg is None:
        cfg = load_config_files([directory / "config" / "config.yaml", *(directory / f for f in configfiles)])
    a = cost.assumptions(cfg)
    invocations, local = ev.load(directory)
    since = min((inv.start for inv in invocations), default=time.time() - 30 * 86400)
    on_cluster = any(not la.local for la in local)
    records = slurm.query(directory, since, env, slurm_logdirs) if on_cluster or not invocations else None
    by_comment: dict[str, list[slurm.SlurmAttempt]] = {}
    for rec in records or []:
        by_comment.setdefault(rec.comment, []).append(rec)
    local_by_key: dict[str, list[ev.LocalAttempt]] = {}
    for la in local:
        local_by_key.setdefault(la.key, []).append(la)
    rerun = to_run(directory, targets, list(configfiles), full_plan)
    alive = {inv.workflow_id: inv.alive for inv in invocations}
    jobs = []
    for job in plan:
        try:
            planned = cost.job_hours(job, cfg, a) * job.gpus
        except (SystemExit, ValueError, KeyError):
            planned = None
        recs = by_comment.get(job.key, [])
        if recs:
            attempts = _slurm_attempts(directory, job, recs, slurm_logdirs)
        else:
            attempts = _local_attempts(directory, job, local_by_key.get(job.key, []), records is not None)
        if not attempts and job.benchmark and (directory / job.benchmark).exists():  # ran before events were kept
            s = _benchmark_seconds(directory / job.benchmark)
            attempts = [Attempt(1, "COMPLETED", s, job.gpus, None, None)]
        open_ = _head_open(local_by_key.get(job.key, []), attempts, alive)
        state = _state(directory, job, attempts, open_)
        again = rerun.get(job.key, "") if state == "done" else ""
        jobs.append(JobStatus(job.key, job.rule, job.wildcards, job.wildcards.get("model", ""), job.gpus, planned,
                              "waiting" if again else state, attempts, job.output, job, rerun=again))
    shown = list(targets) if targets else default_targets(plan_jobs(directory, [], list(configfiles)))
    if by_comment:
        accounting = "sacct"
    elif on_cluster and records is None:
        accounting = "none: no sacct here, Slurm jobs timed by Snakemake's events (queue wait included)"
    else:
        accounting = "benchmark files"
    return Status(str(directory), shown, jobs, _target_jobs(directory, plan, shown), accounting,
                  [{"workflow_id": i.workflow_id, "start": i.start, "last": i.last, "closed": i.closed, "alive": i.alive,
                    "done": i.done, "total": i.total, "errors": len(i.errors)} for i in invocations])


def _head_open(local: list[ev.LocalAttempt], attempts: list[Attempt], alive: dict[str, bool | None]) -> bool:
    """Whether a Snakemake head still holds the job: its last attempt neither ended nor was cut off.
    A head on another host (a login node: its process cannot be seen from here) is taken to hold a
    Slurm job only while Slurm says the job has not ended; once it has, the attempt is closed (else a
    failed job whose head died there would show "queued" forever)."""
    if not local or local[-1].ok is not None or local[-1].cut_off:
        return False
    last = attempts[-1] if attempts else None
    if alive.get(local[-1].invocation) is None and last is not None and last.slurm_jobid:
        return last.state in (*slurm.ACTIVE_STATES, "REQUEUED")
    return True


def _state(directory: Path, job: cost.Job, attempts: list[Attempt], snakemake_open: bool) -> str:
    last = attempts[-1] if attempts else None
    outputs_there = bool(job.output) and all((directory / o).exists() for o in job.output)
    if last is None:
        return "done" if outputs_there else "waiting"
    if last.state in ("PENDING", "REQUEUE_HOLD", "REQUEUE_FED") or (last.state == "REQUEUED" and snakemake_open):
        return "queued"
    if last.state in (*slurm.ACTIVE_STATES, "SUBMITTED"):
        return "running"
    if last.state == "COMPLETED":
        if outputs_there:
            return "done"
        if snakemake_open:
            return "running"  # Slurm says done; Snakemake is checking its outputs
        return "failed" if local and local[-1].ok is False else "waiting"  # missing output, or to be made again
    if last.reason:
        return "queued" if snakemake_open and last.slurm_jobid else "failed"
    return "done" if outputs_there else "waiting"


def hours_text(hours: float | None) -> str:
    if hours is None or (isinstance(hours, float) and math.isnan(hours)):
        return "-"
    if hours < 1 / 60:
        return f"{hours * 3600:.0f} s"
    if hours < 1:
        return f"{hours * 60:.1f} min"
    return f"{hours:.1f} h"
