"""Snakemake logger plugin ``pwopsd``: a run's job events, one JSON object a line.

    snakemake --logger pwopsd ...        (this workflow attaches it to every run by itself)

The workflow attaches it to every run of itself (workflow/rules/common.smk, :func:`attach`);
``--logger pwopsd`` attaches it as a plugin, in any workflow. Each Snakemake invocation that runs a job (not a dry run, not a run with nothing to do) writes its own file,
``.snakemake/pwopsd/events/<start time>-<workflow id>.jsonl`` under the working directory: the
workflow's start, the planned job counts, every job's submission (rule, wildcards, outputs, logs,
benchmark, resources), start, end and error (with the executor's message, which for Slurm names
the job id and state), workflow errors and the close. ``python -m pwopsd.status`` reads these
files; the console output is left to Snakemake's own handler.

Why not an existing plugin: snakemake-logger-plugin-snkmt 0.1.9 (SQLite), tried with Snakemake
9.27.1, recorded a failed attempt that Snakemake retried as still running (Snakemake announces
the retry's start before its job info), split each benchmark path into one-character entries,
and marked a run whose failed job succeeded on retry as failed (docs/status.md).
"""

import json
import logging
import os
import socket
import time
from types import SimpleNamespace
from dataclasses import dataclass, field
from datetime import datetime, timezone
from logging import LogRecord
from pathlib import Path
from typing import Optional

from snakemake_interface_logger_plugins.base import LogHandlerBase
from snakemake_interface_logger_plugins.settings import LogHandlerSettingsBase

EVENTS_DIR = Path(".snakemake") / "pwopsd" / "events"


@dataclass
class LogHandlerSettings(LogHandlerSettingsBase):
    dir: Optional[Path] = field(
        default=None,
        metadata={"help": f"Folder of the event files (default: {EVENTS_DIR} in the working directory).",
                  "env_var": False, "required": False},
    )


def _plain(value):
    """``value`` as JSON can hold it (Snakemake's file lists, resources and wildcards)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_plain(v) for v in value]
    return str(value)


def _files(value) -> list[str]:
    if not value:
        return []
    if isinstance(value, str):  # one file (Snakemake passes a benchmark as a string)
        return [value]
    return [str(v) for v in value]


def _resources(record: LogRecord) -> dict:
    res = getattr(record, "resources", None)
    names = getattr(res, "_names", None)
    if res is None or names is None:
        return {}
    return {name: _plain(value) for name, value in zip(names, res) if not name.startswith("_")}


def event_of(record: LogRecord) -> Optional[dict]:
    """The JSON object recorded for a Snakemake log record (None: not a job or workflow event)."""
    event = getattr(record, "event", None)
    if event is None:
        return None
    name = getattr(event, "value", str(event)).lower()
    out = {"event": name, "time": record.created}
    if name == "workflow_started":
        out.update(workflow_id=str(getattr(record, "workflow_id", "")), snakefile=str(getattr(record, "snakefile", "")),
                   cwd=os.getcwd(), host=socket.gethostname(), pid=os.getpid())
    elif name == "run_info":
        out["stats"] = _plain(getattr(record, "stats", {}))
    elif name == "job_info":
        out.update(jobid=getattr(record, "jobid", None), rule=getattr(record, "rule_name", ""),
                   wildcards=_plain(getattr(record, "wildcards", {}) or {}),
                   output=_files(getattr(record, "output", None)), log=_files(getattr(record, "log", None)),
                   benchmark=_files(getattr(record, "benchmark", None)), resources=_resources(record),
                   threads=getattr(record, "threads", None), local=bool(getattr(record, "local", False)),
                   reason=str(getattr(record, "reason", "") or ""))
    elif name == "job_started":
        jobs = getattr(record, "jobs", None) or []
        out["jobs"] = [jobs] if isinstance(jobs, int) else list(jobs)
    elif name == "job_finished":
        out["jobid"] = getattr(record, "job_id", None)
    elif name == "job_error":
        out.update(jobid=getattr(record, "jobid", None), rule=getattr(record, "rule_name", ""),
                   msg=str(getattr(record, "rule_msg", "") or ""), log=_files(getattr(record, "log", None)))
    elif name == "error":
        out.update(exception=str(getattr(record, "exception", "") or ""), rule=getattr(record, "rule", None),
                   msg=record.getMessage()[:2000])
    elif name == "progress":
        out.update(done=getattr(record, "done", None), total=getattr(record, "total", None))
    else:
        return None
    return out


class LogHandler(LogHandlerBase):
    active = False  # a handler of this plugin is attached to this process's Snakemake

    def __post_init__(self) -> None:
        self._pending: list = []  # events before the workflow's start names the file
        self._file = None
        self._closed = False
        LogHandler.active = True

    def _open(self, started: dict) -> None:
        folder = Path(self.settings.dir) if self.settings and self.settings.dir else EVENTS_DIR
        folder = folder if folder.is_absolute() else Path(started["cwd"]) / folder
        folder.mkdir(parents=True, exist_ok=True)
        stamp = datetime.fromtimestamp(started["time"], timezone.utc).strftime("%Y%m%dT%H%M%S")
        self._file = open(folder / f"{stamp}-{started['workflow_id']}.jsonl", "a", encoding="utf-8")

    def _write(self, event: dict) -> None:
        # One write per line, flushed: a reader sees whole lines while the run goes on.
        # Keys in Snakemake's order: a job's wildcards keep the rule's order (its Slurm comment's).
        self._file.write(json.dumps(event) + "\n")
        self._file.flush()

    def emit(self, record: LogRecord) -> None:
        if self._closed or self.common_settings.dryrun:
            return
        try:
            event = event_of(record)
            if event is None:
                return
            if self._file is None:
                # The file is opened at the first job or error: a run with nothing to do leaves none.
                self._pending.append(event)
                started = next((e for e in self._pending if e["event"] == "workflow_started"), None)
                if started is None or event["event"] not in ("job_started", "job_info", "job_error", "error"):
                    return
                self._open(started)
                for earlier in self._pending:
                    self._write(earlier)
                self._pending = []
                return
            self._write(event)
        except Exception:  # noqa: BLE001 - a monitoring failure must not stop the workflow
            self.handleError(record)

    def close(self) -> None:
        if self._file is not None and not self._closed:
            try:
                self._write({"event": "closed", "time": time.time()})
                self._file.close()
            except Exception:  # noqa: BLE001
                pass
        self._closed = True
        super().close()

    @property
    def writes_to_stream(self) -> bool:
        return False

    @property
    def writes_to_file(self) -> bool:
        return False

    @property
    def has_filter(self) -> bool:
        return True  # every record reaches emit, which keeps the events

    @property
    def has_formatter(self) -> bool:
        return True

    @property
    def needs_rulegraph(self) -> bool:
        return False


def attach(dryrun: bool) -> Optional[LogHandler]:
    """Attach a handler to Snakemake's logger when ``--logger pwopsd`` did not: the workflow calls
    this while its Snakefile is read (main process only), so that every run of it records its
    events, also from a Snakemake environment where this package is not installed (the workflow
    puts src/ on its path) and with any profile. None when one is attached already."""
    if LogHandler.active:
        return None
    common = SimpleNamespace(dryrun=dryrun, printshellcmds=False, nocolor=True, quiet=None, debug_dag=False,
                             verbose=False, show_failed_logs=False, stdout=False)
    handler = LogHandler(common, LogHandlerSettings())
    logging.getLogger("snakemake.logging").addHandler(handler)  # closed by logging.shutdown at exit
    return handler
