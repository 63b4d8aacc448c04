"""Training with a colocated vLLM rollout engine (``training.rollout_backend: vllm``), executed with
vLLM's CPU build on the tiny model (see ``test_vllm_engine.py`` for the environment).

The sync is what these tests prove: the engine is fed the current LoRA adapter before every
rollout batch, so its greedy rollouts equal the ``hf`` backend's on the live model at step 0 and
after training steps. The prompts are longer than vLLM's prefix-cache block (128 tokens here):
a sync that reused KV blocks computed with older weights, or an adapter id with new weights,
would give stale rollouts only on such prompts.
"""

from __future__ import annotations

import json
import time

import pytest
import torch

from conftest import REPO, paper_train_config
from pwopsd.generation import GenerationRequest
from pwopsd.generation.rollout import HFRollouts, make_rollouts
from pwopsd.training.loop import Example, Trainer
from test_vllm_engine import engine_processes

CPU_ENGINE = {"gpu_memory_utilization": 0.4, "enforce_eager": True, "kv_cache_memory_gib": 1,
              "enable_chunked_prefill": False, "in_process": True}
PREFIX_BLOCK = 128


@pytest.fixture(scope="module")
def base(tiny_model_dir):
    return {"model": "tiny", "path": tiny_model_dir}


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
                                           engine=cfg.rollout_engine, sync_dir=work_dir / "rollout-sync")
    return trainer


def greedy(trainer) -> list[list[int]]:
    return [GenerationRequest(tuple(ids), temperature=0.0, max_new_tokens=24) for ids in trainer.student_ids]


@pytest.fixture(scope="module")
def whole_run(base, tiny_tokenizer, tmp_path_factory):
    """One process trained to step 4 with vLLM's default layout inside the rank's engine process
    (engine core and worker in processes of their own, as on a GPU node), the sync checked at steps
    0 and 4: the engine's greedy rollouts equal the live model's, and training changed them, so a
    stale engine would fail. Returns the adapter and the checks' outputs."""
    from peft import get_peft_model_state_dict

    work = tmp_path_factory.mktemp("whole")
    since = time.time()
    trainer = make_trainer(base, tiny_tokenizer, work, train_config(rollout_engine={**CPU_ENGINE, "in_process": False}))
    outputs, same = {}, {}
    try:
        live = HFRollouts(trainer.inner, tiny_tokenizer, batch_size=16)
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


def test_a_killed_run_with_vllm_rollouts_resumes_to_the_same_adapter(whole_run, base, tiny_tokenizer, tmp_path):
    from peft import get_peft_model_state_dict

    for stop in (2, None):  # killed after step 2, then a new job resumes from step-000002
        trainer = make_trainer(base, tiny_tokenizer, tmp_path / "killed", train_config())
        try:
            trainer.train(stop_after=stop)
        finally:
            trainer.rollout_engine.close()
    log = [json.loads(line) for line in (tmp_path / "killed" / "train_log.jsonl").read_text().splitlines()]
    assert [h["step"] for h in log] == [1, 2, 3, 4]
    resumed = get_peft_model_state_dict(trainer.model)
    for key, value in whole_run["adapter"].items():
        torch.testing.assert_close(resumed[key], value, rtol=0, atol=0)


def test_two_processes_with_vllm_rollouts_train_like_one(whole_run, base, tmp_path):
    """torchrun with 2 processes, each with its own rollout engine and half of every step's
    problems, against the one-process run with the same micro-batches: per-request seeds make the
    rollouts independent of the rank that samples them."""
    import pandas as pd
    from safetensors.torch import load_file

    from pwopsd.config import grading_options, load_config
    from pwopsd.training.job import launch

    examples = long_examples()
    pd.DataFrame({"problem": [e.problem for e in examples], "solution": [e.solution for e in examples],
                  "answer": [e.answer for e in examples]}).to_parquet(tmp_path / "corpus.parquet")
    (tmp_path / "base.json").write_text(json.dumps(base))
    args = {"manifest": str(tmp_path / "base.json"), "corpus": str(tmp_path / "corpus.parquet"),
            "train": vars(train_config(gradient_accumulation_steps=1)),
            "dtype": "float32", "chat_template": {"add_special_tokens": False, "think_closure": True},
            "grading": grading_options(load_config(REPO / "config" / "config.yaml")),
            "work_dir": str(tmp_path / "work"), "eval_step": 4, "adapter_out": str(tmp_path / "adapter"),
            "log_out": str(tmp_path / "train_log.jsonl")}
    launch(args, processes=2, args_path=tmp_path / "args.json", log_path=tmp_path / "rule.log")
    assert sorted(p.name for p in (tmp_path / "work" / "rollout-sync").iterdir()) == ["rank-0", "rank-1"]
    adapter = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert len(adapter) == len(whole_run["adapter"])
    # Equal rollouts, so only the order of floating-point sums differs (all-reduce vs accumulation),
    # which Adam can magnify in an element whose gradient is near 0: compare each matrix as a whole.
    # Other rollouts would change the adapters by tens of percent.
    for key, value in whole_run["adapter"].items():
        assert float((adapter[key] - value).norm() / value.norm()) < 1e-3, key
