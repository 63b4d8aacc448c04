"""Training with a colocated vLLM rollout engine (``training.rollout_backend: vllm``), executed with
vLLM's CPU build on the tiny model (see ``test_vllm_engine.py`` for the environment).

The sync is what these tests prove: the engine is fed the current policy before every rollout
batch, so its greedy rollouts equal the ``hf`` backend's at step 0 and after training steps, for
both rollout policies: ``adapter`` (the current LoRA adapter under a new id; ``hf`` on the live
model) and ``merged_bf16`` (the LoRA merged into bf16 base weights, reloaded by the engine; ``hf``
on a model holding the same merged weights). The prompts are longer than vLLM's prefix-cache block
(128 tokens here): a sync that reused KV blocks computed with older weights, or an adapter id with
new weights, would give stale rollouts only on such prompts. The failure modes: an engine that
cannot start, and one that dies mid-run (the run fails, the checkpoint before it is intact, a rerun
resumes to the same adapter).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from conftest import REPO, paper_train_config
from pwopsd.generation import GenerationRequest
from pwopsd.generation.rollout import HFRollouts, make_rollouts
from pwopsd.training.loop import Example, RolloutEngineError, Trainer, latest_checkpoint
from test_vllm_engine import engine_processes

CPU_ENGINE = {"gpu_memory_utilization": 0.4, "enforce_eager": True, "kv_cache_memory_gib": 1,
              "enable_chunked_prefill": False, "in_process": True}
PREFIX_BLOCK = 128


@pytest.fixture(scope="module")
def base(tiny_model_dir):
    return {"model": "tiny", "path": tiny_model_dir}


@pytest.fixture(scope="module")
def tokenizer(base):
    """The model's own tokenizer, as the train job loads it (the tiny run's model was built with
    its own, another than the session's ``tiny_tokenizer``)."""
    from pwopsd.models import load_tokenizer

    return load_tokenizer(base)


def long_examples(k: int = 12) -> list[Example]:
    """Problems whose student prompts run past one prefix-cache block: a long preamble of worked
    sums, then the question."""
    from pwopsd.tiny.arithmetic import sample_problems

    problems = sample_problems(11, k + 14, [1, 2], 20)
    preamble = " ".join(f"{p.problem} {p.answer}." for p in problems[k:])
    return [Example(f"{preamble} {p.problem}", p.reference_solution(), str(p.answer)) for p in problems[:k]]


def train_config(**overrides):
    # 4 problems a step in micro-batches of 2: one process accumulates 2, two processes take 1 each.
    settings = dict(lora_r=8, lora_alpha=16, lr=2e-2, max_steps=4, save_every=2, per_device_batch_size=2,
                    gradient_accumulation_steps=2, max_completion_length=24, chunk_size=16, seed=5,
                    rollout_backend="vllm", rollout_engine=CPU_ENGINE)
    return paper_train_config("pwopsd", **{**settings, **overrides})


def make_trainer(base, tokenizer, work_dir, cfg):
    from pwopsd.models import load_model

    trainer = Trainer(load_model(base, dtype="float32"), tokenizer, long_examples(), cfg, work_dir,
                      add_special_tokens=False)
    trainer.rollout_engine = make_rollouts("vllm", model=trainer.inner, tokenizer=tokenizer, batch_size=16,
                                           model_path=base["path"], dtype="float32", lora_rank=cfg.lora_r,
                                           engine=cfg.rollout_engine, sync_dir=work_dir / "rollout-sync",
                                           policy=cfg.rollout_policy)
    return trainer


def greedy(trainer) -> list[list[int]]:
    return [GenerationRequest(tuple(ids), temperature=0.0, max_new_tokens=24) for ids in trainer.student_ids]


@pytest.fixture(scope="module")
def whole_run(base, tokenizer, tmp_path_factory):
    """One process trained to step 4 with vLLM's default layout inside the rank's engine process
    (engine core and worker in processes of their own, as on a GPU node), the sync checked at steps
    0 and 4: the engine's greedy rollouts equal the live model's, and training changed them, so a
    stale engine would fail. Returns the adapter and the checks' outputs."""
    from peft import get_peft_model_state_dict

    work = tmp_path_factory.mktemp("whole")
    since = time.time()
    trainer = make_trainer(base, tokenizer, work, train_config(rollout_engine={**CPU_ENGINE, "in_process": False}))
    outputs, same = {}, {}
    try:
        live = HFRollouts(trainer.inner, tokenizer, batch_size=16)
        for step in (0, 4):
            if step:
                history = trainer.train()
                assert [h["step"] for h in history] == [1, 2, 3, 4]
                assert all(h["sync_seconds"] > 0 for h in history)  # synced before every rollout batch
            trainer.rollout_engine.sync(trainer.model, trainer.step)
            engine = [c[0].token_ids for c in trainer.rollout_engine.generate(greedy(trainer))]
            outputs[step] = [c[0].token_ids for c in live.generate(greedy(trainer))]
            same[step] = sum(e == h for e, h in zip(engine, outputs[step]))
        assert len(engine_processes(since)) == 2  # the rank's engine core and worker
    finally:
        trainer.rollout_engine.close()
    return {"adapter": {k: v.clone() for k, v in get_peft_model_state_dict(trainer.model).items()}, "outputs": outputs,
            "same": same, "prompt_lengths": [len(ids) for ids in trainer.student_ids], "left": engine_processes(since)}


def test_synced_vllm_rollouts_equal_hf_rollouts_at_step_0_and_after_training(whole_run):
    assert min(whole_run["prompt_lengths"]) > PREFIX_BLOCK
    n = len(whole_run["prompt_lengths"])
    assert whole_run["same"] == {0: n, 4: n}, f"synced vLLM rollouts equal to hf per step (of {n}): {whole_run['same']}"
    assert whole_run["outputs"][0] != whole_run["outputs"][4]


def test_the_rollout_engine_leaves_no_process_after_the_run(whole_run):
    left = whole_run["left"]
    assert not left, f"engine processes left after close(): {[(p.pid, p.name()) for p in left]}"


def test_a_rollout_engine_that_dies_fails_the_run_and_a_rerun_resumes_to_the_same_adapter(whole_run, base, tokenizer,
                                                                                         tmp_path):
    """The rank's engine process is killed (as the OOM killer would) before step 4's rollouts: the
    run fails naming the step and the checkpoint, step-000002 is intact, a new job resumes from it
    and ends with the uninterrupted run's adapter."""
    from peft import get_peft_model_state_dict

    work = tmp_path / "killed"
    trainer = make_trainer(base, tokenizer, work, train_config())
    step = trainer.train_step

    def train_step():
        if trainer.step == 3:
            engine = trainer.rollout_engine.backend._ranks[0].process
            engine.kill()
            engine.join()
        return step()

    trainer.train_step = train_step
    try:
        with pytest.raises(RolloutEngineError) as info:
            trainer.train()
    finally:
        trainer.rollout_engine.close()
    line = str(info.value)
    assert "\n" not in line and "at step 3" in line and "died" in line and "resumes from step-000002" in line, line
    assert latest_checkpoint(work).name == "step-000002"
    trainer = make_trainer(base, tokenizer, work, train_config())  # the rerun
    try:
        trainer.train()
    finally:
        trainer.rollout_engine.close()
    log = [json.loads(line) for line in (work / "train_log.jsonl").read_text().splitlines()]
    assert [h["step"] for h in log] == [1, 2, 3, 4]
    resumed = get_peft_model_state_dict(trainer.model)
    for key, value in whole_run["adapter"].items():
        torch.testing.assert_close(resumed[key], value, rtol=0, atol=0)


def job_args(base, tmp_path, train):
    import pandas as pd

    from pwopsd.config import grading_options, load_config

    examples = long_examples()
    pd.DataFrame({"problem": [e.problem for e in examples], "solution": [e.solution for e in examples],
                  "answer": [e.answer for e in examples]}).to_parquet(tmp_path / "corpus.parquet")
    (tmp_path / "base.json").write_text(json.dumps(base))
    return {"manifest": str(tmp_path / "base.json"), "corpus": str(tmp_path / "corpus.parquet"), "train": vars(train),
            "dtype": "float32", "chat_template": {"add_special_tokens": False, "think_closure": True},
            "grading": grading_options(load_config(REPO / "config" / "config.yaml")),
            "work_dir": str(tmp_path / "work"), "eval_step": 4, "adapter_out": str(tmp_path / "adapter"),
            "log_out": str(tmp_path / "train_log.jsonl")}


def test_a_rollout_engine_that_cannot_start_fails_the_job_with_one_line(base, tmp_path):
    """A KV cache too small for one sequence: the train job fails at step 0 with one line naming
    the setting to check, and leaves no engine process."""
    from pwopsd.training.job import run

    since = time.time()
    with pytest.raises(RolloutEngineError) as info:
        run(job_args(base, tmp_path, train_config(rollout_engine={**CPU_ENGINE, "kv_cache_memory_gib": 1e-4})))
    line = str(info.value)
    assert "\n" not in line and "at step 0" in line and "did not start" in line, line
    assert "kv_cache_memory_gib=0.0001" in line and "models.<model>.vllm" in line, line
    assert not engine_processes(since)


def test_two_processes_with_vllm_rollouts_train_like_one(whole_run, base, tmp_path_factory):
    """torchrun with 2 processes, each with its own rollout engine and half of every step's
    problems, against the one-process run with the same micro-batches: per-request seeds make the
    rollouts independent of the rank that samples them. (The 2-process run, made once a session,
    is also what ``test_vllm_notice.py`` resumes a 2-process run to.)"""
    from safetensors.torch import load_file

    from uninterrupted import reference

    _, args = reference(base, tmp_path_factory, policy="adapter", processes=2)
    # each rank synced its engine through a folder of this attempt (rollout-sync/<job>/rank-N), removed at the end
    work = Path(args["work_dir"])
    assert not (work / "rollout-sync").exists() or not any((work / "rollout-sync").iterdir())
    adapter = load_file(Path(args["adapter_out"]) / "adapter_model.safetensors")
    assert len(adapter) == len(whole_run["adapter"])
    # Equal rollouts, so only the order of floating-point sums differs (all-reduce vs accumulation),
    # which Adam can magnify in an element whose gradient is near 0: compare each matrix as a whole.
    # Other rollouts would change the adapters by tens of percent.
    for key, value in whole_run["adapter"].items():
        assert float((adapter[key] - value).norm() / value.norm()) < 1e-3, key


@pytest.fixture(scope="module")
def merged_run(base, tokenizer, tmp_path_factory):
    """The reference's rollout policy (``merged_bf16``) on the vLLM engine: one process trained to
    step 4, the engine's greedy rollouts at steps 0 and 4 against ``hf`` on a model holding the same
    merged bf16 weights."""
    work = tmp_path_factory.mktemp("merged")
    trainer = make_trainer(base, tokenizer, work, train_config(rollout_policy="merged_bf16"))
    outputs, same, syncs = {}, {}, []
    try:
        reference = HFRollouts(trainer.inner, tokenizer, batch_size=16, policy="merged_bf16")
        for step in (0, 4):
            if step:
                syncs = [h["sync_seconds"] for h in trainer.train()]
            trainer.rollout_engine.sync(trainer.model, trainer.step)
            engine = [c[0].token_ids for c in trainer.rollout_engine.generate(greedy(trainer))]
            reference.sync(trainer.model, trainer.step)
            outputs[step] = [c[0].token_ids for c in reference.generate(greedy(trainer))]
            same[step] = sum(e == h for e, h in zip(engine, outputs[step]))
    finally:
        trainer.rollout_engine.close()
    return {"outputs": outputs, "same": same, "syncs": syncs, "folder": sorted(p.name for p in (work / "rollout-sync").iterdir())}


def test_the_merged_bf16_policy_is_reloaded_by_the_engine_every_step(merged_run):
    n = len(long_examples())
    assert merged_run["same"] == {0: n, 4: n}, f"merged vLLM rollouts equal to hf per step (of {n}): {merged_run['same']}"
    assert merged_run["outputs"][0] != merged_run["outputs"][4]
    assert len(merged_run["syncs"]) == 4 and all(s > 0 for s in merged_run["syncs"])
    assert merged_run["folder"] == ["policy"]  # the engine's model folder only: no adapters


@pytest.mark.parametrize("policy", ["merged_bf16", "adapter"])
def test_at_the_papers_learning_rate_an_engine_that_never_reloads_stops_the_run_naming_the_step(base, tokenizer,
                                                                                             tmp_path, policy):
    """At lr 5e-6 (the paper's) a step moves the policy's log-probs by less than the probe's
    tolerance, so an engine left on old weights samples almost the same rollouts. The probe's exact
    fingerprint of the synced weights tells it apart: a synced engine trains 2 steps, its log-probs
    of the probe within tolerance of the trainer's and changed at the second sync; then the same
    engine's reload (merged_bf16) or adapter switch (adapter) is disabled and the run stops at its
    next sync, naming the step. (One engine for both halves: a second engine and model load cost
    about 30 CPU-seconds on a 2-core host.)"""
    from pwopsd.generation.rollout import PROBE_TOLERANCE

    cfg = train_config(lr=5e-6, max_steps=3, save_every=2, rollout_policy=policy)
    trainer = make_trainer(base, tokenizer, tmp_path / "run", cfg)
    try:
        assert [h["step"] for h in trainer.train(stop_after=2)] == [1, 2]
        probe = trainer.rollout_engine.probe
        first = probe.last[1]
        synced = (probe.last[2], probe.max_mean_difference, probe.max_difference)
        if policy == "merged_bf16":
            trainer.rollout_engine.backend.reload_weights = lambda: None
        else:
            trainer.rollout_engine.backend.use_adapter = lambda path: None
        with pytest.raises(RolloutEngineError, match="failed at step 2 .*StaleEngineError: step 2: the synced policy's "
                                                     "weights changed since step 1"):
            trainer.train()
    finally:
        trainer.rollout_engine.close()
    tolerance = PROBE_TOLERANCE["bfloat16" if policy == "merged_bf16" else "float32"]
    last, mean, largest = synced
    assert last == 1 and 0 < mean <= tolerance and largest > 0
    print(f"{policy}: the engine's probe log-probs lie within {mean:.2e} of the trainer's on average, "
          f"{largest:.2e} at most")
    assert first is not None
