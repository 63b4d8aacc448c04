"""One engine per job: the vLLM backend's engine lifecycle, with data parallelism and resume.

vLLM cannot run on these CPU machines; ``tests/vllm_standin`` records engine constructions and
generate calls (see its docstring). The calls themselves are checked against the real pinned
vLLM release in ``test_vllm_contract.py``.
"""

import json
import os
from types import SimpleNamespace

import pandas as pd
import pytest

from conftest import REPO
from pwopsd.generation import GenerationRequest, get_backend
from pwopsd.generation.vllm_backend import gpu_groups, round_robin, sampling_params_kwargs, to_completions
from pwopsd.generation.sampling import generate_resumable, make_backend, run_generations

pytestmark = pytest.mark.vllm_stack

OPTIONS = {"tensor_parallel_size": 1, "data_parallel_size": 1, "gpu_memory_utilization": 0.9, "enforce_eager": True}


@pytest.fixture
def standin(monkeypatch, tmp_path):
    """Import ``vllm`` from the stand-in (here and in spawned rank processes); return a reader of its log."""
    path = str(REPO / "tests" / "vllm_standin")
    monkeypatch.syspath_prepend(path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([path, os.environ.get("PYTHONPATH", "")]))
    for name in [m for m in list(__import__("sys").modules) if m == "vllm" or m.startswith("vllm.")]:
        monkeypatch.delitem(__import__("sys").modules, name)
    log = tmp_path / "standin.jsonl"
    monkeypatch.setenv("PWOPSD_VLLM_STANDIN_LOG", str(log))

    def records():
        lines = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
        engines = [r for r in lines if "generate" not in r]
        calls = [r["generate"] for r in lines if "generate" in r]
        return engines, calls

    return records


def _requests(k, n=2, seed=1):
    return [GenerationRequest((5, 6, 7 + i), n=n, seed=seed, temperature=1.0, top_p=0.95, max_new_tokens=8)
            for i in range(k)]


def _backend(**options):
    return make_backend("vllm", {"path": "/models/m"}, dtype="bfloat16", max_model_len=64, options={**OPTIONS, **options})


def test_a_250_request_generation_job_builds_exactly_one_engine(standin, tmp_path, tiny_tokenizer):
    tiny_tokenizer.save_pretrained(tmp_path / "model")
    tables = {"a": 150, "b": 100}
    benchmarks = [(name, pd.DataFrame({"id": [f"{name}{i}" for i in range(k)], "problem": [f"{i} + {i}" for i in range(k)]}))
                  for name, k in tables.items()]
    settings = {"n": 2, "temperature": 1.0, "top_p": 0.95, "top_k": -1, "max_new_tokens": 8, "max_model_len": 256,
                "enable_thinking": True}
    run_generations(benchmarks=benchmarks, seeds={"1": (1, [tmp_path / f"{name}.parquet" for name in tables])},
                    manifest={"path": str(tmp_path / "model")}, settings=settings,
                    chat_template={"add_special_tokens": False}, dtype="bfloat16", backend_name="vllm",
                    backend_options=OPTIONS, metadata={})
    engines, calls = standin()
    assert len(engines) == 1 and engines[0]["pid"] == os.getpid()
    assert engines[0]["model"] == str(tmp_path / "model") and engines[0]["max_model_len"] == 256
    assert calls == [100, 50, 100]  # every shard of both benchmarks on the same engine
    for name, k in tables.items():
        out = pd.read_parquet(tmp_path / f"{name}.parquet")
        assert len(out) == 2 * k and out.groupby("problem_id").size().eq(2).all()


def test_data_parallel_ranks_each_build_one_engine_and_match_one_engine(standin, monkeypatch, tmp_path):
    requests = _requests(250)
    keys = [{"problem_id": f"p{i}"} for i in range(250)]
    with _backend() as single:
        expected = generate_resumable(single, requests, keys, partial=tmp_path / "single")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    with _backend(data_parallel_size=2) as backend:
        got = generate_resumable(backend, requests, keys, partial=tmp_path / "dp")
        processes = [rank.process for rank in backend._ranks]
    engines, calls = standin()
    dp_engines = engines[1:]
    assert len(dp_engines) == 2  # one per rank, for 3 shards
    assert {e["cuda_visible_devices"] for e in dp_engines} == {"4", "5"}
    assert len({e["pid"] for e in dp_engines}) == 2 and os.getpid() not in {e["pid"] for e in dp_engines}
    assert sorted(calls[3:]) == sorted([50, 50, 50, 50, 25, 25])
    assert not any(p.is_alive() for p in processes)  # close() ends the rank processes
    pd.testing.assert_frame_equal(got, expected)


def test_killed_job_resumes_from_finished_shards_with_one_new_engine(standin, monkeypatch, tmp_path):
    requests = _requests(250)
    keys = [{"problem_id": f"p{i}"} for i in range(250)]
    monkeypatch.setenv("PWOPSD_VLLM_STANDIN_FAIL_AT_CALL", "2")
    with pytest.raises(RuntimeError, match="simulated failure"), _backend() as backend:
        generate_resumable(backend, requests, keys, partial=tmp_path / "partial")
    assert sorted(p.name for p in (tmp_path / "partial").iterdir()) == ["shard-00000.parquet"]
    monkeypatch.delenv("PWOPSD_VLLM_STANDIN_FAIL_AT_CALL")
    with _backend() as backend:
        resumed = generate_resumable(backend, requests, keys, partial=tmp_path / "partial")
    engines, calls = standin()
    assert len(engines) == 2 and calls == [100, 100, 50]  # the restarted job did shards 2 and 3 only
    with _backend() as backend:
        fresh = generate_resumable(backend, requests, keys, partial=tmp_path / "fresh")
    pd.testing.assert_frame_equal(resumed, fresh)


def test_a_failing_data_parallel_rank_fails_the_job_with_its_traceback(standin, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("PWOPSD_VLLM_STANDIN_FAIL_AT_CALL", "1")
    backend = _backend(data_parallel_size=2)
    with pytest.raises(RuntimeError, match=r"rank \d failed:(.|\n)*simulated failure"):
        backend.generate(_requests(4))
    processes = [rank.process for rank in backend._ranks]
    backend.close()
    assert processes and not any(p.is_alive() for p in processes)


def test_vllm_sampling_params_mapping():
    eval_req = GenerationRequest((1, 2, 3), n=12, seed=None, temperature=1.0, top_p=0.95, top_k=-1, max_new_tokens=38912)
    kw = sampling_params_kwargs(eval_req)
    assert kw == {"n": 12, "temperature": 1.0, "top_p": 0.95, "top_k": -1, "min_p": 0.0, "max_tokens": 38912,
                  "stop_token_ids": [], "skip_special_tokens": True}
    assert "seed" not in kw  # "main" run: engine seed applies
    seeded = sampling_params_kwargs(GenerationRequest((1,), n=12, seed=2, top_k=0, top_p=0.95))
    assert seeded["seed"] == 2 and seeded["top_k"] == -1
    rollout = sampling_params_kwargs(GenerationRequest((1,), temperature=1.1, top_p=0.95, top_k=20, max_new_tokens=1024, stop_ids=(5,)))
    assert (rollout["top_k"], rollout["temperature"], rollout["stop_token_ids"]) == (20, 1.1, [5])
    greedy = sampling_params_kwargs(GenerationRequest((1,), temperature=0.0, top_p=0.5, top_k=7))
    assert (greedy["top_p"], greedy["top_k"]) == (1.0, -1)


def test_vllm_output_mapping_and_dp_layout():
    out = SimpleNamespace(outputs=[SimpleNamespace(index=1, token_ids=(4, 2), text="b", finish_reason="stop"),
                                   SimpleNamespace(index=0, token_ids=[3], text="a", finish_reason="length")])
    comps = to_completions(out)
    assert [c.text for c in comps] == ["a", "b"] and comps[1].token_ids == [4, 2]
    assert round_robin(5, 2) == [[0, 2, 4], [1, 3]]
    assert gpu_groups(2, 2, ["0", "1", "2", "3"]) == ["0,1", "2,3"]
    with pytest.raises(RuntimeError, match="needs data_parallel_size x tensor_parallel_size = 4 GPUs, 2 visible"):
        gpu_groups(2, 2, ["0", "1"])


def test_vllm_backend_imports_lazily():
    backend = get_backend("vllm", model_path="/nonexistent", tensor_parallel_size=4)
    assert backend.engine_kwargs["tensor_parallel_size"] == 4 and backend.engine_kwargs["seed"] == 0


def test_vllm_engine_settings_come_from_the_model_entry():
    from pwopsd.config import backend_options, load_config
    from pwopsd.generation.sampling import make_backend

    cfg = load_config(REPO / "config" / "config.yaml")
    backend = make_backend("vllm", {"path": "/models/qwen"}, dtype="bfloat16", max_model_len=40960,
                           options=backend_options(cfg, "qwen3_4b"))
    assert backend.engine_kwargs == {"model": "/models/qwen", "dtype": "bfloat16", "max_model_len": 40960,
                                     "tensor_parallel_size": 4, "gpu_memory_utilization": 0.9, "enforce_eager": True,
                                     "seed": 0, "trust_remote_code": False}
    assert backend.data_parallel_size == 1


def test_a_spine_job_runs_its_greedy_and_fallback_passes_on_one_engine(standin, tmp_path, tiny_tokenizer):
    from pwopsd.diagnostic import phases as bv
    from pwopsd.config import diagnostic_settings, grading_options, load_config
    from pwopsd.evaluation.grading import answer_grader
    from pwopsd.generation.sampling import partial_dir

    cfg = load_config(REPO / "tiny" / "config" / "config.yaml")
    settings = diagnostic_settings(cfg, "tiny_qwen3")
    table = pd.DataFrame({"id": [f"a{i}" for i in range(5)], "problem": [f"Compute {i} + 1." for i in range(5)],
                          "answer": [str(i + 1) for i in range(5)], "solution": ["" for _ in range(5)]})
    problems = bv.sample_problems({"a": table}, {"a": 3}, seed=0)
    with _backend() as backend:
        spines = bv.run_spines(backend, tiny_tokenizer, problems, settings, grade=answer_grader(grading_options(cfg), 1),
                               partial_root=lambda key: partial_dir(tmp_path / "spines.parquet", key))
    engines, calls = standin()
    assert len(engines) == 1 and calls == [3, 3]  # greedy pass, then the fallback for every unboxed spine
    assert list(spines["decoding"]) == ["fallback"] * 3 and not spines["correct"].any()
    assert [list(p) for p in spines["prompt_ids"]] == [
        bv.student_prompt_ids(tiny_tokenizer, p, kind=settings["student_prompt"], chat_template=settings["chat_template"])
        for p in problems["problem"]]
