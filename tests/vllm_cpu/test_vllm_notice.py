"""Slurm's notice in the paper's settings: training that rolls out through a colocated vLLM engine,
and generation on vLLM engines, each sent SIGTERM to every process of the job, as Slurm's
time-limit warning, preemption or ``scancel`` does.

Before the fix (issue 41) the engine's processes took the signal too (vLLM's engine core shuts down
on SIGTERM), the next sync or rollout failed with ``RolloutEngineError``, and the job exited 1 with
no checkpoint of the step: its retry redid every step since the last ``save_every`` checkpoint. Now
the engine processes block the notice signals (``pwopsd.notice.notice_blocked``), the job finishes
the step (or shard) in progress, saves it and exits 75, and the rerun ends equal to an
uninterrupted run: adapter, optimizer state and step log for training; the generations table for
generation.

The notice lands at a chosen point (``notice_harness/sitecustomize.py``: during the weight sync or
as the rollouts start, for both rollout policies, with the engine core in a process of its own,
vLLM's default, or in the engine's process), in 1 and 2 training processes; for generation, after
the first shard, with one engine whose core runs in a process of its own (started by the job's
process; a data-parallel rank is the same kind of engine process as a training's rollout engine,
whose cases cover it). A full grid of the factors would take ~24 trainings of ~50 s here.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from pwopsd.notice import EXIT_INTERRUPTED
from test_vllm_engine import (CPU_OPTIONS, MAX_MODEL_LEN, engine, engine_processes, manifest, problems,  # noqa: F401 (fixtures)
                              prompts, sampled, tokenizer)
from uninterrupted import _env, assert_same_run, configured, finished, reference, train_job

@pytest.fixture(scope="module")
def base(tiny_model_dir):
    return {"model": "tiny", "path": tiny_model_dir}


# Each factor of the paper's settings at each of its values at least once: rollout policy, where the engine core runs, 1 or 2 training
# processes, notice during the weight sync (right after the previous step's checkpoint or log:
# "between steps") or as the rollouts run. Two cases hold every value; a third (adapter, engine
# core in process, 1 process, notice as rollouts start) repeated values of these two and cost three
# trainings, each importing vLLM (issue 54).
CASES = {  # name: (rollout policy, engine core in the engine's process, training processes, notice point)
    "merged_bf16, own engine-core process, notice during the weight sync": ("merged_bf16", False, 1, "sync:2"),
    # 2 processes with the engine core in each rank's engine process: the rank processes are the ones
    # the signal must spare (the engine-core process of vLLM's default layout is the first case's).
    "adapter, 2 processes, engine cores in process, notice as rollouts start": ("adapter", True, 2, "rollouts:2"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_notice_to_every_process_of_a_training_with_vllm_rollouts_loses_no_step(case, base, tmp_path, tmp_path_factory):
    policy, in_process, processes, notice = CASES[case]
    step = int(notice.split(":")[1])
    args = configured(tmp_path, base, policy=policy, in_process=in_process, processes=processes)
    since = time.time()
    stopped = train_job(args, processes, tmp_path, notice=notice)
    log = (tmp_path / "rule.log").read_text()
    assert (tmp_path / "notice-sent.txt").exists(), log[-3000:]
    assert stopped.returncode == EXIT_INTERRUPTED, f"exit {stopped.returncode}: {stopped.stderr[-800:]}\n{log[-3000:]}"
    assert "RolloutEngineError" not in log
    work = Path(args["work_dir"])
    assert sorted(p.name for p in work.glob("step-*"))[-1] == f"step-{step:06d}"  # the step in progress, saved
    assert not engine_processes(since), "engine processes left after the job stopped on notice"
    assert not (work / "rollout-sync").exists() or not any((work / "rollout-sync").iterdir())

    # The rerun with the engine core in the engine's process, the reference's layout (no part of a
    # checkpoint's key): the steps made before the notice, in the case's own layout, are compared
    # with the reference's, and a default-layout case's rerun starts no engine-core process.
    train = {**args["train"], "rollout_engine": {**args["train"]["rollout_engine"], "in_process": True}}
    rerun = train_job({**args, "train": train}, processes, tmp_path)
    assert rerun.returncode == 0, (tmp_path / "rule.log").read_text()[-3000:]
    assert f"resumed from {work / f'step-{step:06d}'}" in (tmp_path / "rule.log").read_text()
    assert_same_run(finished(args), reference(base, tmp_path_factory, policy=policy, processes=processes)[0])


GENERATION_JOB = """
import json, os, sys
from pathlib import Path
from pwopsd.generation import GenerationRequest
from pwopsd.generation.sampling import generate_resumable, make_backend
from pwopsd.notice import Notice, exit_on_notice
from pwopsd.runtime import setup_logging
spec = json.loads(sys.argv[1])
setup_logging(spec["log"])
requests = [GenerationRequest(**{**r, "prompt_ids": tuple(r["prompt_ids"]), "stop_ids": tuple(r["stop_ids"])})
            for r in spec["requests"]]
keys = [{"problem_id": f"p{i}"} for i in range(len(requests))]
with exit_on_notice(console=True), Notice() as notice, \\
        make_backend("vllm", {"path": spec["model"]}, dtype="float32", max_model_len=spec["max_model_len"],
                     options=spec["options"]) as backend:
    table = generate_resumable(backend, requests, keys, partial=Path(spec["partial"]), shard_size=spec["shard_size"],
                               notice=notice)
table.to_parquet(spec["out"])
"""


def generation_job(spec: dict, signal_after_shard: bool) -> subprocess.CompletedProcess:
    """A generation job in a process of its own; with ``signal_after_shard``, once its first shard
    is saved every process of the job (the job's and each engine's) is sent SIGTERM."""
    proc = subprocess.Popen([sys.executable, "-c", GENERATION_JOB, json.dumps(spec)], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if signal_after_shard:
        first = Path(spec["partial"]) / "shard-00000.parquet"
        deadline = time.time() + 600
        while not first.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.01)
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the generation job ended (exit {proc.returncode}) before its first shard: {err[-2000:]}")
        root = psutil.Process(proc.pid)
        for p in [root, *root.children(recursive=True)]:
            try:
                p.send_signal(signal.SIGTERM)
            except psutil.NoSuchProcess:
                pass
    out, err = proc.communicate(timeout=900)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_a_notice_to_every_process_of_a_vllm_generation_job_keeps_its_shards(engine, manifest, prompts, tmp_path):
    """vLLM's default layout (the engine core in a process of its own, started by the job's
    process): stopped after its first shard, the job exits 75 with the shard in progress saved, no
    engine process is left, and its rerun (engine core in process) takes the kept shards and equals
    an uninterrupted generation (on one in-process engine: per-request seeds make samples
    independent of the layout)."""
    from pwopsd.generation import GenerationRequest
    from pwopsd.generation.sampling import generate_resumable

    requests = [{**vars(r), "prompt_ids": list(r.prompt_ids)} for r in sampled(prompts, seed=31, n=4, max_new_tokens=32)]
    options = {**CPU_OPTIONS, "in_process": False}
    spec = {"model": manifest["path"], "max_model_len": MAX_MODEL_LEN, "options": options, "requests": requests,
            "shard_size": 6, "partial": str(tmp_path / "partial"), "out": str(tmp_path / "out.parquet"),
            "log": str(tmp_path / "job.log")}
    since = time.time()
    stopped = generation_job(spec, signal_after_shard=True)
    log = Path(spec["log"]).read_text()
    assert stopped.returncode == EXIT_INTERRUPTED, f"exit {stopped.returncode}: {stopped.stderr[-800:]}\n{log[-3000:]}"
    kept = sorted(p.name for p in Path(spec["partial"]).glob("shard-*.parquet"))
    assert 1 <= len(kept) < len(requests) // 6, kept
    assert not engine_processes(since)
    # The rerun with the engine core in the job's process (the layout is no part of a shard's key):
    # the kept shard is taken whatever layout made it, and the job starts no engine-core process
    # (with the training case's rerun: these two tests 136 CPU-seconds before, 116 after).
    rerun = generation_job({**spec, "options": CPU_OPTIONS}, signal_after_shard=False)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert re.search(rf"\b{len(kept)} of \d+ shards already done, reused", Path(spec["log"]).read_text())
    resumed = pd.read_parquet(spec["out"])
    again = [GenerationRequest(**{**r, "prompt_ids": tuple(r["prompt_ids"]), "stop_ids": tuple(r["stop_ids"])})
             for r in requests]
    fresh = generate_resumable(engine, again, [{"problem_id": f"p{i}"} for i in range(len(again))],
                               partial=tmp_path / "fresh", shard_size=6)
    pd.testing.assert_frame_equal(resumed, fresh)
