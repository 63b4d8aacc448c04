"""A run's job events as the ``pwopsd`` logger plugin records them (src/snakemake_logger_plugin_pwopsd):
one file per Snakemake invocation under ``.snakemake/pwopsd/events``, read into attempts per job.

An attempt opens at the job's start or its job info, whichever Snakemake logs first (it announces
a retry's start before the retry's job info), and closes at its end or its error. An attempt
still open when its invocation closed, or whose Snakemake process is gone from this host, was cut
off with it.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from pwopsd.cost import slurm_comment

EVENTS_DIR = Path(".snakemake") / "pwopsd" / "events"


@dataclass
class LocalAttempt:
    key: str                  # the job's Slurm comment (rule and wildcards), as pwopsd.cost.Job.key
    rule: str
    wildcards: dict
    invocation: str           # the event file's workflow id
    start: float
    end: float | None = None
    ok: bool | None = None    # None: open (running, or cut off: see ``cut_off``)
    cut_off: bool = False
    msg: str = ""             # the executor's error message (Slurm: job id and state)
    log: list[str] = field(default_factory=list)
    benchmark: list[str] = field(default_factory=list)
    resources: dict = field(default_factory=dict)
    local: bool = True

    @property
    def seconds(self) -> float | None:
        return None if self.end is None else max(0.0, self.end - self.start)


@dataclass
class Invocation:
    workflow_id: str
    path: Path
    start: float
    host: str = ""
    pid: int | None = None
    closed: bool = False
    last: float = 0.0
    done: int | None = None
    total: int | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def alive(self) -> bool | None:
        """Whether its Snakemake is still running: False once closed or its process is gone from
        this host; None when it ran on another host (a login node) and did not close."""
        if self.closed:
            return False
        if self.host != socket.gethostname() or self.pid is None:
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def read_events(path: Path) -> list[dict]:
    """The events of one file; a last line still being written is left out."""
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.endswith("\n"):
                break
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def attempts_of(events: list[dict], path: Path) -> tuple[Invocation, list[LocalAttempt]]:
    """One invocation's attempts, in the order they opened."""
    inv = Invocation(workflow_id=path.stem, path=path, start=events[0]["time"] if events else 0.0)
    open_: dict[int, LocalAttempt] = {}
    started: dict[int, float] = {}  # a start seen before its job info
    attempts: list[LocalAttempt] = []
    for ev in events:
        kind, t = ev["event"], ev["time"]
        inv.last = max(inv.last, t)
        if kind == "workflow_started":
            inv.workflow_id, inv.start = ev["workflow_id"], t
            inv.host, inv.pid = ev.get("host", ""), ev.get("pid")
        elif kind == "job_started":
            for jobid in ev["jobs"]:
                if jobid not in open_:
                    started.setdefault(jobid, t)
        elif kind == "job_info":
            jobid = ev["jobid"]
            if jobid in open_ or ev["rule"] == "all" and not ev["output"]:
                continue
            att = LocalAttempt(slurm_comment(ev["rule"], ev["wildcards"]), ev["rule"], ev["wildcards"], inv.workflow_id,
                               start=started.pop(jobid, t), log=ev.get("log", []), benchmark=ev.get("benchmark", []),
                               resources=ev.get("resources", {}), local=ev.get("local", True))
            open_[jobid] = att
            attempts.append(att)
        elif kind in ("job_finished", "job_error"):
            att = open_.pop(ev["jobid"], None)
            started.pop(ev["jobid"], None)
            if att is None:
                continue
            att.end, att.ok = t, kind == "job_finished"
            if kind == "job_error":
                att.msg = ev.get("msg", "")
                att.log = list(dict.fromkeys([*att.log, *ev.get("log", [])]))
        elif kind == "progress":
            inv.done, inv.total = ev.get("done"), ev.get("total")
        elif kind == "error":
            inv.errors.append(ev.get("msg") or ev.get("exception") or "")
        elif kind == "closed":
            inv.closed = True
    if inv.alive is False:
        for att in open_.values():
            att.cut_off = True
    return inv, attempts


def load(directory: Path) -> tuple[list[Invocation], list[LocalAttempt]]:
    """Every recorded invocation of the working directory ``directory`` and their attempts, oldest first."""
    folder = Path(directory) / EVENTS_DIR
    invocations, attempts = [], []
    for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
        events = read_events(path)
        if not events:  # its first line still being written
            continue
        inv, atts = attempts_of(events, path)
        invocations.append(inv)
        attempts += atts
    return invocations, attempts
