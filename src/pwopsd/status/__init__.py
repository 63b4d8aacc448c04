"""Watching a run: progress per target, spend against the cost plan, failures and resubmissions.

    python -m pwopsd.status [--directory DIR] [TARGET ...]           rich tables in the terminal
    python -m pwopsd.status --watch 30                                 ... refreshed every 30 s
    python -m pwopsd.status --html status.html                         one self-contained page
    python -m pwopsd.status --plan-vs-spent [--fit-overlay FILE]       after the run

Sources (docs/status.md): the run's events, recorded by this project's Snakemake logger plugin
(attached by the workflow to every run, or ``--logger pwopsd``); Slurm's accounting (``sacct``) where jobs ran on
Slurm, else the ``benchmark:`` files; the plan is Snakemake's own DAG for the targets, priced by
pwopsd.cost.
"""

from pwopsd.status.collect import Attempt, JobStatus, Status, collect  # noqa: F401
