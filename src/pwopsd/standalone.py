"""Run a workflow script outside Snakemake, for debugging (the pypsa-eur ``mock_snakemake`` idea).

Every script in ``workflow/scripts/`` ends with::

    if __name__ == "__main__":
        main(snakemake if "snakemake" in globals() else standalone_snakemake("<rule>"))

so ``python workflow/scripts/generate.py --directory tiny model=tiny_qwen3 checkpoint=base
benchmark=arith_l1 seed=1`` builds the same ``snakemake`` object (input, output, params, log,
threads, config) that Snakemake would inject for that job, from the real Snakefile and config,
and runs the script in this process. Input files must already exist.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def mock_snakemake(rule: str, directory: str | os.PathLike = ".", **wildcards):
    """The ``snakemake`` object of one job of ``rule`` with the given wildcards.

    The working directory is changed to ``directory`` (where ``config/config.yaml`` is read and
    paths are relative to), as ``snakemake --directory`` does.
    """
    import snakemake as sm
    from snakemake.api import Workflow
    from snakemake.logging import LoggerManager, logger
    from snakemake.script import Snakemake
    from snakemake.settings.types import (
        ConfigSettings,
        DAGSettings,
        OutputSettings,
        ResourceSettings,
        StorageSettings,
        WorkflowSettings,
    )

    os.chdir(directory)
    workflow = Workflow(
        ConfigSettings(),
        ResourceSettings(),
        WorkflowSettings(),
        LoggerManager(logger, OutputSettings()),
        storage_settings=StorageSettings(),
        dag_settings=DAGSettings(rerun_triggers=[]),
        storage_provider_settings=dict(),
    )
    workflow.include(str(REPO / "Snakefile"))
    workflow.global_resources = {}
    rule_obj = workflow.get_rule(rule)
    dag = sm.dag.DAG(workflow, rules=[rule_obj])
    job = sm.jobs.Job(rule_obj, dag, dict(wildcards))
    obj = Snakemake(job.input, job.output, job.params, job.wildcards, job.threads, job.resources, job.log,
                    job.dag.workflow.config, job.rule.name, None)
    for path in list(obj.log) + list(obj.output):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    return obj


def standalone_snakemake(rule: str, argv: list[str] | None = None):
    """Parse ``[--directory DIR] key=value ...`` and build the job's ``snakemake`` object."""
    ap = argparse.ArgumentParser(prog=Path(sys.argv[0]).name, description=f"Run the script of rule {rule!r} outside Snakemake.")
    ap.add_argument("--directory", default=".", help="working directory, as snakemake --directory (default: .)")
    ap.add_argument("wildcards", nargs="*", metavar="name=value", help="wildcard values of the job")
    args = ap.parse_args(argv)
    wildcards = {}
    for item in args.wildcards:
        if "=" not in item:
            ap.error(f"wildcard {item!r} is not of the form name=value")
        key, value = item.split("=", 1)
        wildcards[key] = value
    return mock_snakemake(rule, args.directory, **wildcards)
