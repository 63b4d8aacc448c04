"""Benchmark sampling: prompt construction, clipping to the model length, resumable shards and an
atomic final parquet; and the tiny build check."""

import pandas as pd
import pytest

from pwopsd import prompts
from pwopsd.io import read_parquet_metadata
from pwopsd.generation.sampling import PromptTooLongError, SamplingConfig, benchmark_shards, eval_prompt_ids, sample_benchmark
from pwopsd.tiny.examples import TinyBuildConfig
from pwopsd.tiny.model import check_dev_accuracy

EVAL = {"n": 2, "temperature": 1.0, "top_p": 0.95, "top_k": -1, "max_new_tokens": 8, "max_model_len": 512}


class CountingBackend:
    """The real HF backend, counting the requests it serves and optionally failing mid-job
    (imported here so that this module also loads in the vLLM-stack test environment, without torch)."""

    def __init__(self, *a, fail_after=None, **kw):
        from pwopsd.generation.hf_backend import HFBackend

        self.inner = HFBackend(*a, **kw)
        self.calls, self.fail_after = 0, fail_after

    def generate(self, requests):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise KeyboardInterrupt("simulated preemption")
        self.calls += 1
        return self.inner.generate(requests)

    def versions(self):
        return self.inner.versions()


@pytest.mark.vllm_stack
def test_eval_prompts_use_the_eval_template(tiny_tokenizer):
    ids = eval_prompt_ids(tiny_tokenizer, ["Compute 1 + 1."], enable_thinking=True, add_special_tokens=False)[0]
    text = tiny_tokenizer.decode(ids)
    assert text == prompts.render(tiny_tokenizer, prompts.eval_message("Compute 1 + 1."), prompts.EVAL)
    off = tiny_tokenizer.decode(eval_prompt_ids(tiny_tokenizer, ["x"], enable_thinking=False, add_special_tokens=False)[0])
    assert off.endswith("<think>\n\n</think>\n\n")


def test_the_configured_streams_reach_every_request_and_key_the_kept_shards(tmp_path):
    """``evaluation.sample_streams`` reaches the requests, and shards sampled under one setting are
    never resumed under the other (they hold other samples)."""
    per_prompt, shared = (SamplingConfig.from_evaluation({**EVAL, **extra}, seed=1)
                          for extra in ({}, {"sample_streams": "shared"}))
    prompts_ = [[5, 6, 7], [5, 6, 8]]
    assert [per_prompt.request(p).streams for p in prompts_] == ["per_prompt"] * 2
    assert [shared.request(p).sample_seed(1) for p in prompts_] == [2, 2]
    assert len({per_prompt.request(p).sample_seed(1) for p in prompts_}) == 2
    folders = {cfg.streams: benchmark_shards(["a", "b"], prompts_, cfg, output=tmp_path / "g.parquet", metadata={})[0].file.parent
               for cfg in (per_prompt, shared)}
    assert folders["per_prompt"] != folders["shared"]


@pytest.mark.vllm_stack
def test_new_tokens_clipped_to_model_length():
    cfg = SamplingConfig.from_evaluation({**EVAL, "max_new_tokens": 100, "max_model_len": 50}, seed=1)
    assert cfg.request(list(range(1, 41))).max_new_tokens == 10
    with pytest.raises(PromptTooLongError, match="max_model_len=50"):
        cfg.request(list(range(1, 51)))


def test_interrupted_sampling_resumes_from_finished_shards(tmp_path, random_tiny_model, tiny_tokenizer):
    problems = [f"Compute {i} + 2." for i in range(5)]
    ids = eval_prompt_ids(tiny_tokenizer, problems, enable_thinking=True, add_special_tokens=False)
    pids = [f"p{i}" for i in range(5)]
    cfg = SamplingConfig.from_evaluation(EVAL, seed=3)
    meta = {"model": "random"}

    reference = sample_benchmark(CountingBackend(random_tiny_model, tiny_tokenizer), pids, ids, cfg,
                                 output=tmp_path / "ref.parquet", metadata=meta, shard_size=2)

    out = tmp_path / "gen.parquet"
    with pytest.raises(KeyboardInterrupt):
        sample_benchmark(CountingBackend(random_tiny_model, tiny_tokenizer, fail_after=2), pids, ids, cfg,
                         output=out, metadata=meta, shard_size=2)
    assert not out.exists()  # no half-written output
    resumed_backend = CountingBackend(random_tiny_model, tiny_tokenizer)
    resumed = sample_benchmark(resumed_backend, pids, ids, cfg, output=out, metadata=meta, shard_size=2)
    assert resumed_backend.calls == 1  # only the third shard was generated again
    pd.testing.assert_frame_equal(resumed, reference)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gen.parquet", "ref.parquet"]  # partial dir removed
    assert len(resumed) == 10 and resumed["sample_index"].tolist()[:2] == [0, 1]
    assert read_parquet_metadata(out)["sampling"]["seed"] == 3


def test_a_notice_signal_saves_the_shard_in_progress_and_the_rerun_generates_only_the_rest(tmp_path, random_tiny_model,
                                                                                          tiny_tokenizer):
    """SIGTERM (Slurm's warning, time limit or preemption) during the second of three shards: the
    shard finishes and is saved, the job stops with Interrupted (exit 75) before the third, no
    output is written, and the rerun generates the third shard alone, equal to an uninterrupted job."""
    import os
    import signal

    from pwopsd.notice import Interrupted, Notice

    problems = [f"Compute {i} + 3." for i in range(5)]
    ids = eval_prompt_ids(tiny_tokenizer, problems, enable_thinking=True, add_special_tokens=False)
    pids, cfg, meta = [f"p{i}" for i in range(5)], SamplingConfig.from_evaluation(EVAL, seed=5), {"model": "random"}
    reference = sample_benchmark(CountingBackend(random_tiny_model, tiny_tokenizer), pids, ids, cfg,
                                 output=tmp_path / "ref.parquet", metadata=meta, shard_size=2)

    class SignalledBackend(CountingBackend):
        def generate(self, requests):
            if self.calls == 1:  # inside the second shard
                os.kill(os.getpid(), signal.SIGTERM)
            return super().generate(requests)

    out = tmp_path / "gen.parquet"
    backend = SignalledBackend(random_tiny_model, tiny_tokenizer)
    with Notice() as notice, pytest.raises(Interrupted, match="stopped on SIGTERM with 2 of 3 shards saved"):
        sample_benchmark(backend, pids, ids, cfg, output=out, metadata=meta, shard_size=2, notice=notice)
    assert backend.calls == 2 and not out.exists()
    rerun = CountingBackend(random_tiny_model, tiny_tokenizer)
    pd.testing.assert_frame_equal(sample_benchmark(rerun, pids, ids, cfg, output=out, metadata=meta, shard_size=2), reference)
    assert rerun.calls == 1


def test_small_shards_share_a_backend_call_and_an_interrupted_group_resumes_from_its_saved_shards(
        tmp_path, random_tiny_model, tiny_tokenizer):
    """run_shards: consecutive shards (here of two benchmarks and two seeds) go to the backend
    together while their requests number at most group_size; each is still saved as its own shard,
    and the samples equal those of one call per shard. Stopped before its second group, a job
    reruns only that group."""
    from pwopsd.generation.sampling import plan_shards, read_shards, run_shards

    ids = eval_prompt_ids(tiny_tokenizer, [f"Compute {i} + 4." for i in range(5)], enable_thinking=True,
                          add_special_tokens=False)

    def plans(root):  # benchmark a (3 problems) and b (2 problems), seeds 1 and 2, shards of 2 problems
        out = []
        for seed in (1, 2):
            cfg = SamplingConfig.from_evaluation(EVAL, seed=seed)
            for name, lo, hi in (("a", 0, 3), ("b", 3, 5)):
                reqs = [cfg.request(p) for p in ids[lo:hi]]
                out.append(plan_shards(reqs, [{"problem_id": f"{name}{i}"} for i in range(lo, hi)],
                                       partial=tmp_path / root / f"{name}-{seed}", shard_size=2))
        return out

    class Sizes(CountingBackend):
        def generate(self, requests):
            self.sizes.append(len(requests))
            return super().generate(requests)

    one_by_one = plans("apart")
    backend = Sizes(random_tiny_model, tiny_tokenizer)
    backend.sizes = []
    run_shards(backend, [s for shards in one_by_one for s in shards], group_size=2)
    assert backend.sizes == [2, 1, 2, 2, 1, 2]  # one call a shard

    together = plans("together")
    grouped = Sizes(random_tiny_model, tiny_tokenizer, fail_after=1)
    grouped.sizes = []
    with pytest.raises(KeyboardInterrupt):  # stopped in the second group (seed 2)
        run_shards(grouped, [s for shards in together for s in shards], group_size=5)
    assert grouped.sizes == [5, 5]  # shards of 2+1+2 problems (seed 1, both benchmarks), then seed 2's
    assert [s.file.exists() for shards in together for s in shards] == [True] * 3 + [False] * 3  # one file a shard
    rerun = Sizes(random_tiny_model, tiny_tokenizer)
    rerun.sizes = []
    run_shards(rerun, [s for shards in together for s in shards], group_size=5)
    assert rerun.sizes == [5]
    for a, b in zip(one_by_one, together, strict=True):
        pd.testing.assert_frame_equal(read_shards(a), read_shards(b))


def test_a_job_with_several_outputs_keeps_every_shard_until_all_are_written(tmp_path, random_tiny_model, tiny_tokenizer):
    """Snakemake deletes every output of a job that stops early: a benchmark written before the stop
    is then sampled again from its kept shards, with no generation."""
    problems = [f"Compute {i} - 1." for i in range(3)]
    ids = eval_prompt_ids(tiny_tokenizer, problems, enable_thinking=True, add_special_tokens=False)
    pids, cfg, meta = [f"p{i}" for i in range(3)], SamplingConfig.from_evaluation(EVAL, seed=2), {"model": "random"}
    out = tmp_path / "first.parquet"
    first = sample_benchmark(CountingBackend(random_tiny_model, tiny_tokenizer), pids, ids, cfg, output=out,
                             metadata=meta, clear=False)
    out.unlink()  # the job stopped on a later benchmark: Snakemake removed this output
    again = CountingBackend(random_tiny_model, tiny_tokenizer)
    pd.testing.assert_frame_equal(sample_benchmark(again, pids, ids, cfg, output=out, metadata=meta), first)
    assert again.calls == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["first.parquet"]


def test_changed_settings_do_not_reuse_stale_shards(tmp_path, random_tiny_model, tiny_tokenizer):
    ids = eval_prompt_ids(tiny_tokenizer, ["Compute 1 + 2.", "Compute 3 + 4."], enable_thinking=True, add_special_tokens=False)
    out = tmp_path / "gen.parquet"
    with pytest.raises(KeyboardInterrupt):
        sample_benchmark(CountingBackend(random_tiny_model, tiny_tokenizer, fail_after=1), ["a", "b"], ids,
                         SamplingConfig.from_evaluation(EVAL, seed=1), output=out, metadata={}, shard_size=1)
    backend = CountingBackend(random_tiny_model, tiny_tokenizer)
    sample_benchmark(backend, ["a", "b"], ids, SamplingConfig.from_evaluation(EVAL, seed=2), output=out, metadata={}, shard_size=1)
    assert backend.calls == 2


def _acc(student, eval_, teacher):
    return {"student": {"mean": student}, "eval": {"mean": eval_}, "teacher": {"mean": teacher}}


def test_the_build_check_asks_that_the_student_know_its_facts():
    cfg = TinyBuildConfig(min_teacher_gap=0.2, student_accuracy_range=[0.15, 0.85], min_greedy_accuracy=0.9)
    acc = _acc(0.40, 0.45, 0.70)
    missing = check_dev_accuracy(acc, cfg)
    assert len(missing) == 1 and "not measured" in missing[0]
    assert check_dev_accuracy({**acc, "student_greedy": {"mean": 0.9}}, cfg) == []
    assert check_dev_accuracy({**acc, "student_greedy": {"mean": 0.9}}, cfg, margin=0.05) == []  # no margin on facts
    low = check_dev_accuracy({**acc, "student_greedy": {"mean": 0.69}}, cfg)
    assert len(low) == 1 and "greedy student-prompt accuracy 69.0%" in low[0] and "tiny.min_greedy_accuracy=90%" in low[0]
    assert check_dev_accuracy(acc, TinyBuildConfig(min_teacher_gap=0.2)) == []  # 0: no such check


def test_dev_accuracy_measures_greedy_student_accuracy_when_asked(random_tiny_model, tiny_tokenizer):
    from pwopsd.tiny.model import dev_accuracy

    cfg = TinyBuildConfig(max_value=9, min_greedy_accuracy=0.9)
    acc = dev_accuracy(random_tiny_model, tiny_tokenizer, cfg, per_level=2)
    assert set(acc) == {"student", "eval", "teacher", "student_greedy"} and set(acc["student_greedy"]) == {"L1", "L2", "L3", "mean"}
    assert "student_greedy" not in dev_accuracy(random_tiny_model, tiny_tokenizer, TinyBuildConfig(max_value=9), per_level=2)


def test_tiny_build_check_boundaries():
    cfg = TinyBuildConfig(min_teacher_gap=0.2, student_accuracy_range=[0.15, 0.85])
    assert check_dev_accuracy(_acc(0.40, 0.45, 0.60), cfg) == []
    gap = check_dev_accuracy(_acc(0.40, 0.45, 0.59), cfg)
    assert len(gap) == 1 and "min_teacher_gap" in gap[0]
    low = check_dev_accuracy(_acc(0.10, 0.45, 0.95), cfg)
    assert len(low) == 1 and "student-prompt accuracy 10.0%" in low[0]
    high = check_dev_accuracy(_acc(0.50, 0.90, 0.95), cfg)
    assert any("eval-prompt accuracy 90.0%" in p for p in high)
