"""Checks and settings for runs that submit to Slurm (``--profile slurm``), applied by the Snakefile
before any job starts (rules use nothing from here).

* :func:`submits_to_slurm`: a run whose default resources name a Slurm account is a cluster run.
* :func:`placeholder_problems`: the profile's ``CHANGE_ME`` values, each named with its file and key,
  so that a run with an unset account or partition stops before any job, local or remote.
* :func:`planning_flag`: the command-line flag that makes a run submit nothing (``-n``, ``--dag``,
  ...), for which those values are a warning and the plan is shown.
* :func:`export_max_runtime`: the partition's maximum runtime, which caps every runtime expression in
  the profile (``min(... * attempt, $PWOPSD_MAX_RUNTIME_MIN)``), from ``cluster.max_runtime_min``.
"""

from __future__ import annotations

import os
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
