"""Training jobs of the vLLM rollout tests run as the train rule runs them (``launch`` in a process of
its own, optionally sent Slurm's notice at a chosen point: ``notice_harness/sitecustomize.py``),
and the uninterrupted run of each configuration, made once per test session and shared by the
tests that compare against it (``test_vllm_notice.py``, ``test_vllm_rollouts.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from conftest import REPO
from test_vllm_rollouts import CPU_ENGINE, job_args, train_config

HARNESS = Path(__file__).parent / "notice_harness"

TRAIN_JOB = """
import json, os, sys
os.environ["PWOPSD_TEST_JOB_ROOT"] = str(os.getpid())  # the job's first process, as Slurm's job step
from pwopsd.notice import exit_on_notice
from pwopsd.runtime import setup_logging
from pwopsd.training.job import launch
args, processes, log = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
os.makedirs(args["work_dir"], exist_ok=True)  # as the train script does
setup_logging(log)
with exit_on_notice(console=True):
    launch(args, processes=processes, args_path=os.path.join(args["work_dir"], "launch_args.json"), log_path=log)
"""


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PWOPSD_TEST_")}
    return {**env, "PYTHONPATH": os.pathsep.join([str(HARNESS), str(REPO / "src")]), "PYTHONUNBUFFERED": "1", **extra}


def train_job(args: dict, processes: int, tmp: Path, notice: str | None = None) -> subprocess.CompletedProcess:
    """The train rule's launch in a process of its own; with ``notice`` (``sync:2``, ``rollouts:3``)
    every process of the job is sent SIGTERM at that point of that step."""
    extra = {}
    if notice:
        extra = {"PWOPSD_TEST_NOTICE": notice, "PWOPSD_TEST_NOTICE_SENT": str(tmp / "notice-sent.txt")}
    return subprocess.run([sys.executable, "-c", TRAIN_JOB, json.dumps(args), str(processes), str(tmp / "rule.log")],
                          env=_env(**extra), capture_output=True, text=True, timeout=900)


def finished(args: dict) -> dict:
    """What an equal run must reproduce: the exported adapter's bytes, the last checkpoint's
    optimizer state, the step log without its timings."""
    work = Path(args["work_dir"])
    state = torch.load(sorted(work.glob("step-*/trainer_state.pt"))[-1], weights_only=False)
    log = [{k: v for k, v in json.loads(line).items() if not k.endswith("seconds")}  # timings: the step's and its parts'
           for line in Path(args["log_out"]).read_text().splitlines()]
    return {"adapter": {f.name: f.read_bytes() for f in sorted(Path(args["adapter_out"]).iterdir())},
            "optimizer": state["optimizer"], "step": state["step"], "log": log}


def assert_same_run(got: dict, want: dict) -> None:
    assert got["log"] == want["log"]
    assert got["step"] == want["step"]
    assert got["adapter"] == want["adapter"]  # byte for byte
    for (k, a), (_, b) in zip(sorted(got["optimizer"]["state"].items()), sorted(want["optimizer"]["state"].items())):
        for name in a:
            torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=f"optimizer state {k}.{name}")


def configured(tmp: Path, base: dict, *, policy: str, in_process: bool, processes: int) -> dict:
    tmp.mkdir(parents=True, exist_ok=True)
    accumulation = 2 // processes  # 4 problems a step in micro-batches of 2, as in test_vllm_rollouts
    return job_args(base, tmp, train_config(rollout_policy=policy, gradient_accumulation_steps=accumulation,
                                            rollout_engine={**CPU_ENGINE, "in_process": in_process}))


_REFERENCES: dict = {}


def reference(base, tmp_path_factory, *, policy: str, processes: int) -> tuple[dict, dict]:
    """The uninterrupted run of a rollout policy in a number of processes, its engine core in the
    engine's process (one per configuration and test session): what :func:`finished` reads of it,
    and its job arguments (its files). Where the engine core runs does not
    change a rollout (the same engine code, per-request seeds), so it serves both layouts: a resumed
    run of the other layout must equal it too."""
    key = (policy, processes)
    if key not in _REFERENCES:
        tmp = tmp_path_factory.mktemp("reference")
        args = configured(tmp, base, policy=policy, in_process=True, processes=processes)
        done = train_job(args, processes, tmp)
        assert done.returncode == 0, (tmp / "rule.log").read_text()[-3000:]
        _REFERENCES[key] = (finished(args), args)
    return _REFERENCES[key]


