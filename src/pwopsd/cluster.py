"""Checks and settings for runs that submit to Slurm (``--profile slurm``), applied by the Snakefile
before any job starts (rules use nothing from here).

* :func:`submits_to_slurm`: a run whose default resources name a Slurm account is a cluster run.
* :func:`placeholder_problems`: the profile's ``CHANGE_ME`` values, each named with its file and key,
  so that a run with an unset account or partition stops before any job, local or remote.
* :func:`planning_flag`: the command-line flag that makes a run submit nothing (``-n``, ``--dag``,
  ...), for which those values are a warning and the plan is shown.
* :func:`export_max_runtime`: the partition's maximum runtime, which caps every runtime expression in
  the profile (``min(... * attempt, $PWOPSD_MAX_RUNTIME_MIN)``), from ``cluster.max_runtime_min``.
* :class:`Profile`: what the profile gives each rule's jobs (:meth:`Profile.limits`: the time limit of
  every attempt, :func:`runtime_minutes`, and the warning before it, :func:`slurm_warning`), which
  :mod:`pwopsd.cost` checks against the work a job finishes on notice.
"""

from __future__ import annotations

import ast
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

PROFILE = "profiles/slurm/profile.yaml"
PLACEHOLDER = "CHANGE_ME"
MAX_RUNTIME_ENV = "PWOPSD_MAX_RUNTIME_MIN"


def resource_args(default_resources: Any) -> dict[str, str]:
    """``name=value`` strings of Snakemake's default resources (``--default-resources``) as a dict."""
    args = getattr(default_resources, "args", None) or []
    return dict(a.split("=", 1) for a in args if "=" in a)


def submits_to_slurm(defaults: Mapping[str, str]) -> bool:
    return "slurm_account" in defaults or "slurm_partition" in defaults


def placeholder_problems(defaults: Mapping[str, str], per_rule: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One message per resource still set to a ``CHANGE_ME`` placeholder."""
    problems = [f"{PROFILE}: default-resources.{key} is {value}: set it for your cluster"
                for key, value in sorted(defaults.items()) if PLACEHOLDER in str(value)]
    for rule, resources in sorted(per_rule.items()):
        for key, value in sorted(dict(resources).items()):
            value = getattr(value, "raw", value)  # Snakemake keeps a profile expression's text as `raw`
            if PLACEHOLDER in str(value):
                problems.append(f"{PROFILE}: set-resources.{rule}.{key} is {value}: set it for your cluster")
    return problems


# Snakemake's flags (argparse destinations) after which it plans, draws or lists, and runs no job.
PLANNING_FLAGS = ("dryrun", "dag", "rulegraph", "filegraph", "d3dag", "summary", "detailed_summary", "list_rules",
                  "list_target_rules", "list_changes", "list_untracked", "list_conda_envs", "lint", "print_compilation",
                  "containerize", "report")


def planning_flag(argv: list[str]) -> str | None:
    """The first flag of ``argv`` (Snakemake's command line, parsed by Snakemake's own parser, so
    that ``-np`` counts) with which no job runs, or None: then the run may submit. The Snakefile is
    read before Snakemake knows its executor, so the command line is what tells; anything it
    cannot read counts as a run that submits."""
    import contextlib
    import io

    from snakemake.cli import get_argument_parser

    parser = get_argument_parser()
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # Snakemake itself reports a bad command line
            args, _ = parser.parse_known_args(argv)
    except (SystemExit, Exception):  # noqa: BLE001 - an unreadable command line submits
        return None
    for dest in PLANNING_FLAGS:
        if getattr(args, dest, None) not in (None, False):
            action = next(a for a in parser._actions if a.dest == dest)
            return action.option_strings[0]
    return None


def export_max_runtime(minutes: int, env: dict | None = None) -> None:
    env = os.environ if env is None else env
    env[MAX_RUNTIME_ENV] = str(int(minutes))



def slurm_restart(env: Mapping[str, str] | None = None, show_job=None) -> str | None:
    """A line saying that Slurm restarted this job (requeued after preemption, a failed node or
    ``scontrol requeue``: the same job id, run again), or None for a first run or outside Slurm.

    The count is ``SLURM_RESTART_COUNT`` where the job sees it; inside a Snakemake job step it does
    not: the slurm-jobstep executor plugin (0.6.1, ``run_job``) passes its ``srun`` only a few
    ``SLURM_*`` variables, so the count is then read from ``scontrol show job`` (``show_job``: the
    function that returns that text for a job id; a test passes its own)."""
    env = os.environ if env is None else env
    jobid = env.get("SLURM_JOB_ID")
    count = env.get("SLURM_RESTART_COUNT")
    if count is None and jobid:
        count = restarts_of((show_job or _show_job)(jobid))
    if not count or str(count).strip() == "0":
        return None
    return f"Slurm job {jobid or '?'} restarted (restart {str(count).strip()}): resuming from its last checkpoint"


def restarts_of(show_job_text: str | None) -> str | None:
    """The ``Restarts=`` count of ``scontrol show job`` output (None when it is missing)."""
    import re

    found = re.search(r"\bRestarts=(\d+)", show_job_text or "")
    return found[1] if found else None


def _show_job(jobid: str) -> str | None:
    import subprocess

    try:
        return subprocess.run(["scontrol", "show", "job", "-o", str(jobid)], capture_output=True, text=True,
                              timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None


# ---------------------------------------------------------------------------------------------
# What the profile gives each rule's jobs: the time limit of every attempt and the warning before it.
# Read from Snakemake's own resource settings at parse time (the profile's `default-resources` and
# `set-resources`, or a command line's `--set-resources`, which replaces the latter: what sbatch gets), or
# from the profile file (the cost plan, tests).

# The warning signal the notice handling expects: SIGTERM reaches the job step, where Snakemake's
# inner process waits for its job (SIGUSR1 kills that process at once: docs/cluster.md).
WARNING_SIGNAL = "TERM"

# `--signal=[{R|B}:]<sig>[@<seconds>]` (sbatch; without @ Slurm warns 60 s before the limit).
_SIGNAL_FLAG = re.compile(r"--signal[= ](?P<flags>(?:[A-Za-z]:)*)(?P<sig>\w+)(?:@(?P<seconds>\d+))?")


@dataclass(frozen=True)
class SlurmWarning:
    """A job's warning before its time limit, as asked for with sbatch's ``--signal``."""

    signal: str        # without "SIG": TERM, USR1, ...
    seconds: int       # before the time limit
    batch_only: bool   # `B:`: only the batch shell hears it, not the job step where the job's processes run


def setting_text(value: Any) -> str:
    """A profile value as written (Snakemake keeps an expression's text as ``raw``)."""
    return str(getattr(value, "raw", value)).strip()


def slurm_extra_text(value: Any) -> str:
    """What sbatch gets from a ``slurm_extra`` value: the profile writes it as a quoted Python string
    (``'--signal=TERM@600'``, so that the flag's ``=`` is not read as a resource assignment), which
    Snakemake evaluates to the string."""
    text = setting_text(value)
    try:
        evaluated = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    return evaluated if isinstance(evaluated, str) else text


def slurm_warning(slurm_extra: Any) -> SlurmWarning | None:
    """The ``--signal`` of a rule's ``slurm_extra``, or None when it asks for no warning."""
    found = _SIGNAL_FLAG.search(slurm_extra_text(slurm_extra) if slurm_extra is not None else "")
    if not found:
        return None
    sig = found["sig"].upper()
    if sig.isdigit():
        sig = signal.Signals(int(sig)).name
    return SlurmWarning(signal=sig.removeprefix("SIG"), seconds=int(found["seconds"] or 60),
                        batch_only="B" in found["flags"].upper().split(":"))


def resource_number(value: Any, attempt: int, max_runtime: float, what: str = "a number") -> float:
    """A profile resource (a number, or an expression of ``attempt`` such as ``8000 * attempt`` or
    ``min(720 * attempt, $PWOPSD_MAX_RUNTIME_MIN)``) at ``attempt``, evaluated as Snakemake does
    (environment variables expanded, then Python), with ``$PWOPSD_MAX_RUNTIME_MIN`` = ``max_runtime``.
    Raises ValueError for an expression that needs more than ``attempt`` (the job's input, ...)."""
    cap = str(int(max_runtime)) if max_runtime < 10**12 else str(10**12)  # no cap: a limit no job reaches
    text = setting_text(value).replace(f"${{{MAX_RUNTIME_ENV}}}", cap).replace(f"${MAX_RUNTIME_ENV}", cap)
    try:
        number = eval(os.path.expandvars(text), {"__builtins__": {"min": min, "max": max, "int": int, "round": round}},
                      {"attempt": attempt})
        return float(number)
    except Exception as exc:  # noqa: BLE001 - reported with the setting by the caller
        raise ValueError(f"cannot read {setting_text(value)!r} as {what} of `attempt` ({exc})") from None


def runtime_minutes(runtime: Any, attempt: int, max_runtime: float) -> float:
    """Minutes of a profile runtime at ``attempt`` (:func:`resource_number`)."""
    return resource_number(runtime, attempt, max_runtime, "minutes")


def profile_text(res: dict, key: str) -> str:
    """A profile value as text: written in profile.yaml, or a Snakemake ``Resource`` (the Snakefile's
    preflight reads the parsed profile); '' where unset."""
    value = res.get(key)
    return "" if value is None else setting_text(value)


def resources_key(rule: str) -> str:
    return f"set-resources.{rule}" if rule != "default" else "default-resources"


def job_sizes(profile: dict, max_runtime: float) -> tuple[dict[str, dict], dict[str, str]]:
    """What each rule of ``set-resources`` (and ``default``: every other rule) asks Slurm for at its
    first attempt: partition ('' for the cluster's default), CPUs, memory (MB) and minutes, from
    ``default-resources`` under the rule's own values. Expressions of ``attempt`` are evaluated as
    Snakemake evaluates them (:func:`resource_number`, ``$PWOPSD_MAX_RUNTIME_MIN`` = ``max_runtime``), and human-readable values
    (``12h``, ``64GB``) as Snakemake parses them (humanfriendly). Also returns, per rule, why its
    request cannot be read here (a value missing, or an expression of the job's input)."""
    import math

    import humanfriendly

    defaults = profile.get("default-resources") or {}
    cap = float(max_runtime)

    def number(value, what: str, human) -> float:
        try:
            return resource_number(value, 1, cap, what)
        except ValueError:
            try:
                return human(setting_text(value))
            except Exception:  # noqa: BLE001 - the first error says what it needs
                raise ValueError(f"{what}: cannot read {setting_text(value)!r} before the DAG") from None

    out, unread = {}, {}
    for rule, own in {"default": {}, **(profile.get("set-resources") or {})}.items():
        res = {**defaults, **(own or {})}
        missing = [k for k in ("cpus_per_task", "mem_mb", "runtime") if k not in res]
        if missing:
            unread[rule] = f"no {', '.join(missing)} in " + " or ".join(dict.fromkeys([resources_key(rule), "default-resources"]))
            continue
        try:
            out[rule] = {"partition": profile_text(res, "slurm_partition"),
                         "cpus": max(1, int(number(res["cpus_per_task"], "CPUs", float))),
                         "mem_mb": int(math.ceil(number(res["mem_mb"], "MB", lambda t: humanfriendly.parse_size(t) / 1e6))),
                         "minutes": int(math.ceil(number(res["runtime"], "minutes",
                                                         lambda t: humanfriendly.parse_timespan(t) / 60)))}
        except ValueError as exc:
            unread[rule] = str(exc)
    return out, unread


@dataclass(frozen=True)
class RuleLimits:
    """What the profile gives one rule's jobs: the runtime expression (minutes, of ``attempt``), the
    warning before the limit, and where both are set (named in messages)."""

    rule: str
    runtime: Any
    runtime_key: str
    warning: SlurmWarning | None
    slurm_extra_key: str


@dataclass(frozen=True)
class Profile:
    """The resources a Slurm profile sets: ``defaults`` (``default-resources``) and ``per_rule``
    (``set-resources``), values as written."""

    defaults: Mapping[str, Any]
    per_rule: Mapping[str, Mapping[str, Any]]
    source: str = PROFILE

    @classmethod
    def from_settings(cls, resource_settings, argv: list[str] | None = None) -> "Profile":
        """From Snakemake's resource settings while the Snakefile is read (``workflow.resource_settings``):
        the profile's values, or those of the command line (``argv``), as sbatch will get them. A
        command line's ``--set-resources`` replaces the profile's ``set-resources`` as a whole
        (Snakemake 9.27: the profile's partitions and warnings are then gone), so messages name it."""
        per_rule = {rule: dict(res) for rule, res in dict(resource_settings.overwrite_resources or {}).items()}
        source = f"{PROFILE} or --set-resources" if "--set-resources" in (argv or []) else PROFILE
        return cls(resource_args(resource_settings.default_resources), per_rule, source=source)

    @classmethod
    def from_file(cls, path: str | Path | None = None) -> "Profile":
        """From a profile file (default: this repository's Slurm profile)."""
        import yaml

        ours = Path(__file__).resolve().parents[2] / PROFILE
        path = Path(path) if path is not None else ours
        data = yaml.safe_load(path.read_text()) or {}
        return cls(dict(data.get("default-resources") or {}),
                   {rule: dict(res or {}) for rule, res in (data.get("set-resources") or {}).items()},
                   source=PROFILE if path.resolve() == ours.resolve() else str(path))

    def limits(self, rule: str) -> RuleLimits:
        """The runtime and warning of ``rule``'s jobs (its set-resources entry, else the defaults)."""
        own = self.per_rule.get(rule, {})
        runtime_key = f"set-resources.{rule}.runtime" if "runtime" in own else "default-resources.runtime"
        runtime = own.get("runtime", self.defaults.get("runtime"))
        extra = own.get("slurm_extra", self.defaults.get("slurm_extra"))
        extra_key = f"set-resources.{rule}.slurm_extra" if "slurm_extra" in own or "slurm_extra" not in self.defaults \
            else "default-resources.slurm_extra"
        return RuleLimits(rule, runtime, runtime_key, slurm_warning(extra), extra_key)
