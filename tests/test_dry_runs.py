"""A dry run forked from the fork server that imported Snakemake (tests/dry_runs.py) is the command
``python -m snakemake -n``: the same jobs listed, the same exit status, the same error on bad config,
in the run's own working directory and environment."""

import os
import subprocess
import sys

import pytest
import yaml

import dry_runs
from conftest import REPO, SNAKEFILE, job_counts


def both(args, cwd, env):
    command = subprocess.run([sys.executable, "-m", "snakemake", *SNAKEFILE, *args], cwd=cwd, env=env,
                             capture_output=True, text=True)
    return command, dry_runs.run(SNAKEFILE + list(args), cwd=cwd, env=env)


@pytest.mark.long
def test_a_forked_dry_run_lists_the_commands_jobs_and_fails_as_it_does(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    command, forked = both(["-n", "results/tables/branch_auroc.tex"], REPO, env)
    assert command.returncode == forked.returncode == 0, forked.stderr[-3000:]
    assert job_counts(forked.stdout) == job_counts(command.stdout) and job_counts(forked.stdout)["total"] > 5, (forked.stdout, command.stdout)
    # a bad config, in another working directory: the same error line, no traceback
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["models"]["qwen3_4b"]["dtype"] = "bf16"
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text(yaml.safe_dump(cfg))
    command, forked = both(["-n", "--directory", str(tmp_path)], tmp_path, env)
    assert command.returncode == forked.returncode == 1
    assert "models.qwen3_4b.dtype" in forked.stdout + forked.stderr and "Traceback" not in forked.stderr
    assert [line for line in forked.stderr.splitlines() if "models.qwen3_4b" in line] == \
           [line for line in command.stderr.splitlines() if "models.qwen3_4b" in line]


def test_what_is_forked_is_what_runs_no_job():
    """Read by Snakemake's own parser (``-np`` counts); a run that executes jobs keeps its own process."""
    for plans in (["-n", "t"], ["-np", "t"], ["--lint"], ["--list-rules"], ["--dag"], ["-S"], ["--rulegraph", "--profile", "p"]):
        assert dry_runs.runs_no_job(plans), plans
    for runs in (["-c1", "t"], ["--cores", "2", "--directory", "d"], ["--profile", "slurm", "t"], ["-p", "--jobs", "4"]):
        assert not dry_runs.runs_no_job(runs), runs
