"""Training as the train rule launches it: ``pwopsd.training.job.launch`` with 2 processes starts
torchrun (gloo on CPU) and the result equals one process doing the same micro-batches; a killed
2-process run resumes; only rank 0 writes checkpoints and the step log; every rank's output and a
crashing rank's traceback reach the rule's log and fail the job; a run in a world of the wrong
size refuses to train; checkpoints are reused only by exactly the same run."""

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
import torch
from safetensors.torch import load_file

from conftest import REPO, paper_train_config
from pwopsd.config import grading_options, load_config
from pwopsd.tiny.arithmetic import sample_problems
from pwopsd.training.job import LaunchError, check_world_size, checkpoint_dir, launch, run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base(tmp_path_factory, random_tiny_model, tiny_tokenizer):
    d = tmp_path_factory.mktemp("launch")
    random_tiny_model.save_pretrained(d / "model")
    tiny_tokenizer.save_pretrained(d / "model")
    (d / "base.json").write_text(json.dumps({"model": "tiny", "path": str(d / "model")}))
    problems = sample_problems(3, 64, [1, 2], 20)
    pd.DataFrame({"problem": [p.problem for p in problems], "solution": [p.reference_solution() for p in problems],
                  "answer": [str(p.answer) for p in problems]}).to_parquet(d / "corpus.parquet")
    return d


def _args(d, name, *, accumulation, steps=4, dtype="float32", **train):
    cfg = vars(paper_train_config("pwopsd", lora_r=4, lora_alpha=8, lr=1e-3, max_steps=steps, save_every=2,
                                  per_device_batch_size=2, gradient_accumulation_steps=accumulation,
                                  max_completion_length=12, chunk_size=16, seed=7, **train))
    (d / name).mkdir(exist_ok=True)
    return {"manifest": str(d / "base.json"), "corpus": str(d / "corpus.parquet"), "train": cfg, "dtype": dtype,
            "chat_template": {"add_special_tokens": False, "think_closure": True},
            "grading": grading_options(load_config(REPO / "config" / "config.yaml")), "work_dir": str(d / name / "work"),
            "eval_step": steps, "adapter_out": str(d / name / "adapter"), "log_out": str(d / name / "train_log.jsonl")}


def _adapter(args):
    return load_file(os.path.join(args["adapter_out"], "adapter_model.safetensors"))


def _launch_2(d, name, **kw):
    args = _args(d, name, accumulation=2, **kw)
    launch(args, processes=2, args_path=d / name / "args.json", log_path=d / name / "rule.log")
    return args


@pytest.mark.long
def test_two_processes_equal_one_process_with_the_same_micro_batches(base):
    one = _args(base, "one", accumulation=4)  # 4 micro-batches of 2 in one process ...
    launch(one, processes=1, args_path=base / "one" / "args.json", log_path=base / "one" / "rule.log")
    two = _launch_2(base, "two")  # ... or 2 micro-batches of 2 on each of 2 processes
    a, b = _adapter(one), _adapter(two)
    assert a.keys() == b.keys() and a
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5
    assert any(float(v.abs().max()) > 0 for k, v in b.items() if "lora_B" in k)  # the adapter moved
    log_one = [json.loads(x) for x in open(one["log_out"])]
    log_two = [json.loads(x) for x in open(two["log_out"])]
    assert [x["step"] for x in log_two] == [1, 2, 3, 4]  # rank 0 alone writes the step log
    for x, y in zip(log_one, log_two):
        assert x["grad_norm"] == pytest.approx(y["grad_norm"], rel=1e-4)
        # the step's values over both ranks' micro-batches, not rank 0's half of them
        for key in ("loss", "kl", "student_entropy", "teacher_entropy", "rollout_length", "rollout_accuracy"):
            assert (key in x) == (key in y) and x.get(key) == pytest.approx(y.get(key), rel=1e-4, abs=1e-8), key
    rule_log = (base / "two" / "rule.log").read_text()
    assert "rank0" in rule_log and "rank1" in rule_log and "step 4/4" in rule_log  # both ranks log into the rule's log
    ckpts = sorted(p.name for p in (base / "two" / "work").iterdir())
    assert ckpts == ["step-000002", "step-000004", "train_log.jsonl"]


def _launch_2_in_background(base, name):
    """A 6-step 2-process launch in a process of its own (as the train job's script runs it; a stop
    on notice exits 75), returned once its step-2 checkpoint exists: (args, process, checkpoint)."""
    args = _args(base, name, accumulation=2, steps=6)
    (base / name / "args.json").write_text(json.dumps(args))
    code = ("import json, sys; from pwopsd.training.job import launch; from pwopsd.notice import Interrupted\n"
            f"try: launch(json.load(open({str(base / name / 'args.json')!r})), processes=2, "
            f"args_path={str(base / name / 'launch.json')!r}, log_path={str(base / name / 'rule.log')!r})\n"
            "except Interrupted: sys.exit(75)")
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    first = base / name / "work" / "step-000002" / "trainer_state.pt"
    deadline = time.time() + 300
    while not first.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    return args, proc, first


@pytest.fixture(scope="module")
def uninterrupted(base):
    """The 6-step 2-process run that the interrupted ones must end equal to."""
    return _launch_2(base, "full", steps=6)


def _signal_job(proc, sig):
    """``sig`` to every process of the job, as Slurm signals its cgroup: the launcher, torchrun and
    both ranks (torchrun starts them in sessions of their own). Returns their PIDs."""
    tree = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    return tree


def _rerun_equals(uninterrupted, args, base, name):
    """The rerun resumes from the last checkpoint and ends with the uninterrupted run's adapter,
    bit for bit, and a step log with each step once."""
    done = sorted(p.name for p in (base / name / "work").glob("step-*"))
    launch(args, processes=2, args_path=base / name / "launch.json", log_path=base / name / "rule.log")
    assert f"resumed from {base / name / 'work' / done[-1]} (step {int(done[-1][5:])})" in (base / name / "rule.log").read_text()
    a, b = _adapter(uninterrupted), _adapter(args)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [json.loads(x)["step"] for x in open(args["log_out"])] == [1, 2, 3, 4, 5, 6]


@pytest.mark.heavy  # fault injection and resumes of two-process runs: CI, not the fast tier
def test_a_killed_two_process_run_resumes_to_the_same_adapter(base, uninterrupted):
    args, proc, first = _launch_2_in_background(base, "killed")
    tree = _signal_job(proc, signal.SIGKILL)
    proc.wait()
    time.sleep(1)
    assert not [p for p in tree if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    done = sorted(p.name for p in (base / "killed" / "work").glob("step-*"))
    assert first.exists() and "step-000006" not in done  # killed mid-run
    _rerun_equals(uninterrupted, args, base, "killed")


@pytest.mark.heavy  # fault injection and resumes of two-process runs: CI, not the fast tier
def test_a_notice_to_a_two_process_run_stops_both_ranks_after_one_step_and_the_rerun_is_bit_identical(base, uninterrupted):
    """SIGTERM to every process of the job (as Slurm's time limit, preemption or the profile's
    warning sends it) once step 2 is saved: torchrun passes it on, both ranks finish the same step,
    rank 0 writes its checkpoint, the launcher raises Interrupted (the job's exit status 75); the
    rerun resumes from that step to the adapter and step log of an uninterrupted run."""
    from pwopsd.notice import EXIT_INTERRUPTED

    args, proc, first = _launch_2_in_background(base, "notice")
    _signal_job(proc, signal.SIGTERM)
    assert proc.wait(timeout=300) == EXIT_INTERRUPTED, (base / "notice" / "rule.log").read_text()[-3000:]
    done = sorted(p.name for p in (base / "notice" / "work").glob("step-*"))
    assert done[-1] != "step-000006" and int(done[-1][5:]) >= 2, done
    assert not (base / "notice" / "adapter").exists()  # no output from a stopped run
    _rerun_equals(uninterrupted, args, base, "notice")


@pytest.mark.heavy  # fault injection and resumes of two-process runs: CI, not the fast tier
def test_a_two_process_run_that_loses_one_rank_fails_and_the_rerun_is_bit_identical(base, uninterrupted):
    """SIGKILL to rank 1 alone once step 2 is saved (a lost GPU, the kernel's OOM killer): torchrun
    ends rank 0, the job fails (not the notice status: nothing was saved on the way out) and leaves no
    process; the rerun resumes from the last saved step to the uninterrupted run's adapter and step
    log, bit for bit."""
    from pwopsd.notice import EXIT_INTERRUPTED

    args, proc, first = _launch_2_in_background(base, "rank_lost")
    assert first.exists(), (base / "rank_lost" / "rule.log").read_text()[-3000:]
    children = psutil.Process(proc.pid).children(recursive=True)
    rank1 = [p for p in children if p.environ().get("RANK") == "1" and p.environ().get("LOCAL_RANK") == "1"]
    assert len(rank1) == 1, [(p.pid, p.cmdline()[:3]) for p in children]
    os.kill(rank1[0].pid, signal.SIGKILL)
    status = proc.wait(timeout=300)
    assert status not in (0, EXIT_INTERRUPTED), status
    time.sleep(1)
    assert not [p for p in children if psutil.pid_exists(p.pid) and p.status() != psutil.STATUS_ZOMBIE]
    assert "step-000006" not in {p.name for p in (base / "rank_lost" / "work").glob("step-*")}
    _rerun_equals(uninterrupted, args, base, "rank_lost")


@pytest.mark.heavy  # fault injection and resumes of two-process runs: CI, not the fast tier
def test_a_two_process_run_with_lora_dropout_resumes_each_rank_from_its_own_rng_state_bit_for_bit(base):
    """LoRA dropout 0.05 (the paper's value) in 2 processes: each rank draws its masks from its own
    generator, and the two ranks' generators are at different points at a checkpoint (they draw
    for batches of other shapes). The run stopped after step 2 (stop_at, no part of the run key)
    and continued to step 4 by fresh processes ends with the uninterrupted run's adapter and step
    log, bit for bit: every rank resumed from its own RNG state (restoring rank 0's on every rank,
    as before issue 41, gives rank 1 other masks: another adapter)."""
    full = _launch_2(base, "dropout_full", lora_dropout=0.05)
    first = _args(base, "dropout_resumed", accumulation=2, lora_dropout=0.05, stop_at=2)
    first["eval_step"] = 2
    launch(first, processes=2, args_path=base / "dropout_resumed" / "args.json", log_path=base / "dropout_resumed" / "rule.log")
    work = Path(first["work_dir"])
    assert sorted(p.name for p in work.glob("step-*")) == ["step-000002"]
    rest = _args(base, "dropout_resumed", accumulation=2, lora_dropout=0.05)
    assert rest["work_dir"] == first["work_dir"]
    launch(rest, processes=2, args_path=base / "dropout_resumed" / "args.json", log_path=base / "dropout_resumed" / "rule.log")
    assert f"resumed from {work / 'step-000002'} (step 2)" in (base / "dropout_resumed" / "rule.log").read_text()
    a, b = _adapter(full), _adapter(rest)
    assert a.keys() == b.keys() and [k for k in a if not torch.equal(a[k], b[k])] == []
    strip = lambda path: [{k: v for k, v in json.loads(x).items() if not k.endswith("seconds")} for x in open(path)]  # noqa: E731
    assert strip(full["log_out"]) == strip(rest["log_out"]) and len(strip(rest["log_out"])) == 4
    # The test's premise: both ranks seeded their generator alike, so states that differ at the
    # checkpoint show that dropout drew from them, and differently on each rank.
    ranks = torch.load(work / "step-000002" / "trainer_state.pt", weights_only=False)["rng_ranks"]
    assert len(ranks) == 2 and not torch.equal(ranks[0]["torch"], ranks[1]["torch"])


@pytest.mark.long
def test_a_crashing_rank_fails_the_job_with_its_traceback_in_the_rule_log(base):
    args = _args(base, "crash", accumulation=2)
    args["manifest"] = str(base / "missing.json")
    with pytest.raises(LaunchError, match="training with 2 processes failed"):
        launch(args, processes=2, args_path=base / "crash" / "args.json", log_path=base / "crash" / "rule.log")
    text = (base / "crash" / "rule.log").read_text()
    assert "Traceback" in text and "missing.json" in text and "FileNotFoundError" in text


def test_a_world_of_the_wrong_size_refuses_to_train(base):
    assert check_world_size(2, {"WORLD_SIZE": "2"}) == 2
    with pytest.raises(LaunchError, match="asked for 2 processes but runs in a world of 1"):
        run({**_args(base, "wrong", accumulation=2), "processes": 2})  # what a launcher that started one process gives
    assert not (base / "wrong" / "work").exists()


def test_checkpoints_are_keyed_by_everything_that_determines_the_run(base, tmp_path, caplog):
    shutil.copytree(base / "model", tmp_path / "model")
    manifest = {"model": "tiny", "path": str(tmp_path / "model")}
    (tmp_path / "base.json").write_text(json.dumps(manifest))
    shutil.copy(base / "corpus.parquet", tmp_path / "corpus.parquet")
    args = {**_args(base, "keyed", accumulation=2, steps=2), "manifest": str(tmp_path / "base.json"),
            "corpus": str(tmp_path / "corpus.parquet")}
    root = tmp_path / "checkpoints"

    def train(a):
        a = {**a, "work_dir": str(checkpoint_dir(root, a))}
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="pwopsd.training.loop"):
            launch(a, processes=1, args_path=tmp_path / "args.json")
        return Path(a["work_dir"]), caplog.text

    first, _ = train(args)
    again, text = train(args)  # unchanged inputs: the same folder, resumed at its last step
    assert again == first and "resumed from" in text and "(step 2)" in text
    variants = {"setting": {**args, "train": {**args["train"], "lr": 2e-3}}, "dtype": {**args, "dtype": "bfloat16"},
                "prompt switch": {**args, "chat_template": {**args["chat_template"], "think_closure": False}},
                "rollout policy": {**args, "train": {**args["train"], "rollout_policy": "merged_bf16"}},
                "deterministic kernels": {**args, "train": {**args["train"], "deterministic": True}}}
    keys = {name: checkpoint_dir(root, a) for name, a in variants.items()}
    corpus = pd.read_parquet(tmp_path / "corpus.parquet")
    corpus.iloc[::-1].to_parquet(tmp_path / "corpus.parquet")  # same rows, another order: other batches
    keys["corpus content"] = checkpoint_dir(root, args)
    corpus.to_parquet(tmp_path / "corpus.parquet")
    assert checkpoint_dir(root, args) == first
    # Where a run stops, when it saves and how its rollout engine is laid out are no part of its
    # key: a run that stops later, saves more often or gets more engine memory resumes these checkpoints.
    assert checkpoint_dir(root, {**args, "train": {**args["train"], "stop_at": 1}}) == first
    assert checkpoint_dir(root, {**args, "train": {**args["train"], "save_every": 10}}) == first
    assert checkpoint_dir(root, {**args, "grading": {**args["grading"], "graders": ["corrected"]}}) == first
    engine = {"gpu_memory_utilization": 0.5, "enforce_eager": False, "kv_cache_memory_gib": 8, "in_process": True}
    assert checkpoint_dir(root, {**args, "train": {**args["train"], "rollout_engine": engine}}) == first
    weights = tmp_path / "model" / "model.safetensors"
    original = weights.read_bytes()
    weights.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))  # a rebuilt base model
    keys["base model content"] = checkpoint_dir(root, args)
    retrained, text = train(args)
    assert retrained == keys["base model content"] and "resumed from" not in text  # restarts from step 0
    assert [json.loads(x)["step"] for x in open(retrained / "train_log.jsonl")] == [1, 2]
    weights.write_bytes(original)
    hub = {"model": "m", "hf_id": "org/m", "revision": "a" * 40, "path": str(tmp_path / "model"), "files_sha256": {"w": "1"}}
    (tmp_path / "hub.json").write_text(json.dumps(hub))
    keys["hub model"] = checkpoint_dir(root, {**args, "manifest": str(tmp_path / "hub.json")})
    (tmp_path / "hub.json").write_text(json.dumps({**hub, "revision": "b" * 40}))
    keys["hub revision"] = checkpoint_dir(root, {**args, "manifest": str(tmp_path / "hub.json")})
    assert len({first, *keys.values()}) == len(keys) + 1, keys  # every change, its own folder


def test_a_run_interrupted_across_a_code_change_names_the_modules_and_resumes_only_when_asked(base, tmp_path, caplog,
                                                                                             monkeypatch):
    """Issue 51: a git pull between two attempts of a training changes its run key (the code is part
    of it), so it would restart at step 0 in silence. The folder of the old code's checkpoints is
    found, the changed modules named, and its checkpoints adopted only on the user's word."""
    from pwopsd import keys as keysmod
    from pwopsd.training import job as jobmod

    shutil.copytree(base / "model", tmp_path / "model")
    (tmp_path / "base.json").write_text(json.dumps({"model": "tiny", "path": str(tmp_path / "model")}))
    shutil.copy(base / "corpus.parquet", tmp_path / "corpus.parquet")
    args = {**_args(base, "code", accumulation=2, steps=2), "manifest": str(tmp_path / "base.json"),
            "corpus": str(tmp_path / "corpus.parquet")}
    root = tmp_path / "checkpoints"
    old_key = jobmod.run_key(args)
    old_dir = checkpoint_dir(root, args, old_key)
    old_dir.mkdir(parents=True)
    (old_dir / "run.json").write_text(json.dumps(old_key))
    launch({**args, "work_dir": str(old_dir)}, processes=1, args_path=tmp_path / "args.json")

    real = keysmod.code_digests
    monkeypatch.setattr(jobmod, "code_digests", lambda *e: {**real(*e), "pwopsd.training.loop": "a fix"}, raising=False)
    monkeypatch.setattr(keysmod, "code_digests", lambda *e: {**real(*e), "pwopsd.training.loop": "a fix"})
    new_key = jobmod.run_key(args)
    new_dir = checkpoint_dir(root, args, new_key)
    assert new_dir != old_dir
    new_dir.mkdir(parents=True)
    found = jobmod.same_run_but_code(new_dir, new_key)
    assert found == [(old_dir, ["pwopsd.training.loop"])]
    # another setting as well: not the same run, never offered
    assert jobmod.same_run_but_code(new_dir, {**new_key, "dtype": "bfloat16"}) == []
    assert jobmod.adopt_checkpoints(old_dir, new_dir) == "step-000002"
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pwopsd.training.loop"):
        launch({**args, "work_dir": str(new_dir)}, processes=1, args_path=tmp_path / "args2.json")
    assert "resumed from" in caplog.text and "(step 2)" in caplog.text
    assert (old_dir / "step-000002" / "trainer_state.pt").exists()  # the old code's folder stays as it was


def test_the_train_rule_s_params_and_its_run_key_agree_on_the_grader():
    """Issue 51: ``grading`` was a param of rule train but not in the run key, so a grader change
    reran the training, which resumed from the finished checkpoints and exported the old grader's
    rollout accuracy. The grader only scores rollouts for the log: in neither now."""
    from pwopsd.training.job import NOT_IN_RUN_KEY

    rules = (REPO / "workflow" / "rules" / "train.smk").read_text()
    train_rule = rules[rules.index("rule train:"):rules.index("rule ", rules.index("rule train:") + 5)]
    params = train_rule[train_rule.index("params:"):train_rule.index("threads:")]
    assert "grading" not in params and "grading" not in NOT_IN_RUN_KEY  # and run_key leaves it out (the keyed test)
