"""The first hour on a new cluster (issue 52): the preflight's checks (pwopsd.preflight), the rule
that a job which asked for GPUs never falls back to the CPU, and each rank's own GPU
(pwopsd.accelerator). sbatch's answer to a GRES type is tested on the real test Slurm in
tests/test_slurm.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from pwopsd import accelerator, preflight
from pwopsd.config import load_config

REPO = Path(__file__).resolve().parents[1]
PAPER = load_config(REPO / "config" / "config.yaml")

# DeepSeek-R1-Distill-Llama-8B's config.json (the Hub, revision 6a6f4aa), the fields the KV cache needs.
LLAMA_8B = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
            "torch_dtype": "bfloat16"}


def test_each_job_environment_names_the_driver_it_needs_and_an_old_driver_fails_naming_the_file():
    assert accelerator.env_cuda(REPO / "envs/train.yaml") == (13, 0)
    assert accelerator.env_cuda(REPO / "envs/vllm.yaml") == (12, 8)
    old = {f.message.split(" is built")[0]: f for f in preflight.node_findings("550.54.14")}
    assert set(old) == set(preflight.JOB_ENVS) and not any(f.ok for f in old.values())
    assert ">= 580.65.6" in old["envs/train.yaml"].message and "550.54.14" in old["envs/train.yaml"].message
    assert [f.ok for f in preflight.node_findings("575.57.08")] == [False, True]  # CUDA 12.8 runs, 13.0 does not
    assert all(f.ok for f in preflight.node_findings("580.82.07"))
    (none,) = {f.message for f in preflight.node_findings(None) if "train" in f.message}
    assert "no driver found" in none


def test_a_job_that_asked_for_gpus_and_finds_no_cuda_stops_naming_driver_and_build():
    """On this CPU-only torch: a job with gpu=4 stops before it loads anything; one with gpu=0, or a
    run that rehearses a cluster without GPUs (cluster.gpu_jobs_on_cpu), goes on."""
    import torch

    assert not torch.cuda.is_available()
    job = SimpleNamespace(config={"cluster": {"gpu_jobs_on_cpu": False}}, resources={"gpu": 4}, rule="train")
    with pytest.raises(accelerator.NoCudaError) as exc:
        accelerator.require_job_cuda(job)
    text = str(exc.value)
    assert "rule train asked for 4 GPU(s)" in text and f"torch {torch.__version__}" in text
    assert "NVIDIA driver not found" in text and "CUDA_VISIBLE_DEVICES=" in text
    accelerator.require_job_cuda(SimpleNamespace(config={}, resources={"gpu": 0}, rule="train"))
    accelerator.require_job_cuda(SimpleNamespace(config={"cluster": {"gpu_jobs_on_cpu": True}}, resources={"gpu": 4},
                                                 rule="generate"))


def test_the_cuda_check_asks_nvml_so_that_a_vllm_engine_built_next_can_fork(monkeypatch):
    """torch's own availability check (cudaGetDeviceCount) poisons fork without initialising CUDA:
    vLLM, built next in the job's process, would still fork its engine core and TP workers, which
    then cannot use CUDA. The check sets PYTORCH_NVML_BASED_CUDA_CHECK, which torch reads at each
    call (torch.cuda.is_available's docstring), before it asks. (What a GPU node then does is
    tools/gpu_check.py's to see: this CPU build of torch has no CUDA to poison.)"""
    import torch

    assert "PYTORCH_NVML_BASED_CUDA_CHECK=1" in torch.cuda.is_available.__doc__  # this torch's switch
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    seen = []  # the variable as the check finds it
    monkeypatch.setattr(torch.cuda, "is_available", lambda: seen.append(os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")))
    with pytest.raises(accelerator.NoCudaError):
        accelerator.require_cuda(4, "rule generate")
    assert seen == ["1"]


def test_every_gpu_rules_script_checks_for_cuda_before_its_work():
    """Each script of a rule that asks for GPUs calls the check right after its threads are set."""
    import re

    rules = "".join(p.read_text() for p in (REPO / "workflow/rules").glob("*.smk"))
    gpu_scripts = set()
    for block in re.split(r"\nrule ", rules):
        if re.search(r"^\s+gpu=config_param", block, re.M):
            gpu_scripts.add(re.search(r'"\.\./scripts/(\w+)\.py"', block).group(1))
    assert {"generate", "train", "diagnostic_spines", "diagnostic_teacher_pass"} <= gpu_scripts
    for name in gpu_scripts:
        text = (REPO / "workflow/scripts" / f"{name}.py").read_text()
        assert "    set_threads(snakemake.threads)\n    require_job_cuda(snakemake)" in text, name


def test_a_ranks_engine_gets_its_entry_of_the_visible_gpus_not_its_index():
    assert accelerator.rank_device(1, {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}) == "5"
    assert accelerator.rank_device(1, {}) == "1"
    with pytest.raises(accelerator.NoCudaError, match="rank 2 has no GPU"):
        accelerator.rank_device(2, {"CUDA_VISIBLE_DEVICES": "4,5"})


def test_kv_cache_need_against_an_independent_count():
    """Keys and values, every layer, every KV head, head_dim = hidden / heads, 2 bytes (bf16)."""
    per_token = 2 * 32 * 8 * (4096 // 32) * 2
    assert preflight.kv_bytes_per_token(LLAMA_8B) == per_token == 131072
    assert preflight.kv_bytes_per_token(LLAMA_8B, tensor_parallel=4) == per_token // 4
    assert preflight.kv_bytes_per_token({**LLAMA_8B, "num_key_value_heads": 2}, tensor_parallel=4) == 2 * 32 * 1 * 128 * 2
    assert 131072 * per_token / 2**30 == 16.0


def test_an_8b_rollout_engine_at_its_full_context_does_not_fit_its_training_share():
    """dsr1_llama_8b's rollout engine at 0.30 of an H100: the model's own 131,072-token context (what
    vLLM takes without max_model_len) needs 16 GiB of KV cache where about 6 GiB are left; the
    rollout context the config now gives it (max_completion_length + 3072) fits."""
    cfg = json.loads(json.dumps(PAPER))
    cfg["training"]["rollout_max_model_len"] = 131072
    (full,) = [f for f in preflight.engine_findings(cfg, {"dsr1_llama_8b": LLAMA_8B}) if "rollout" in f.message]
    assert not full.ok and "16.0 GiB of KV cache" in full.message
    assert full.setting == "models.dsr1_llama_8b.vllm.train_gpu_memory_utilization or training.rollout_max_model_len"
    share = 0.30 * 79.6 - 8.0 * 1e9 * 2 / 2**30 - preflight.ENGINE_OVERHEAD_GIB
    assert f"leaves {share:.1f} GiB" in full.message
    found = preflight.engine_findings(PAPER, {"dsr1_llama_8b": LLAMA_8B})
    assert {f.message.split(":")[1].strip() for f in found} == {"the rollout engine of each training rank",
                                                                  "the evaluation engine"}
    assert all(f.ok for f in found), [f.message for f in found]


def test_the_rollout_engine_is_started_with_the_rollout_context():
    from pwopsd.config import rollout_engine_settings

    assert rollout_engine_settings(PAPER, "dsr1_llama_8b")["max_model_len"] == 1024 + 3072
    cfg = json.loads(json.dumps(PAPER))
    cfg["training"]["rollout_max_model_len"] = 8192
    assert rollout_engine_settings(cfg, "dsr1_llama_8b")["max_model_len"] == 8192


def test_the_profile_deploys_conda_environments_and_a_node_without_conda_is_told():
    """The profile sets the deployment method (else jobs run without torch or vLLM); its CHANGE_ME
    values, the GPU type among them, are each named; conda missing from the PATH is a failure."""
    profile = yaml.safe_load((REPO / "profiles/slurm/profile.yaml").read_text())
    assert profile["software-deployment-method"] == "conda"
    found = preflight.profile_findings(profile, which=lambda name: None)
    failed = {f.setting for f in found if not f.ok}
    assert {"default-resources.slurm_account", "default-resources.slurm_partition", "set-resources.generate.gpu_model",
            "set-resources.generate.slurm_partition", "PATH"} == failed
    (gpu_type,) = [f.message for f in found if "CHANGE_ME_GPU_TYPE" in f.message]
    assert "set-resources.train.gpu_model" in gpu_type and "set-resources.mc_dropout.gpu_model" in gpu_type
    with_conda = preflight.profile_findings(profile, which=lambda name: "/opt/miniforge/bin/conda")
    assert [f.ok for f in with_conda if f.check == "software"] == [True]
    bare = {k: v for k, v in profile.items() if k != "software-deployment-method"}
    assert "software-deployment-method" in {f.setting for f in preflight.profile_findings(bare) if not f.ok}


def test_slurm_time_limits_and_gres_types_are_read_as_sinfo_prints_them():
    assert [preflight.limit_minutes(t) for t in ("2-00:00:00", "1:30:00", "45:00", "90", "infinite")] == \
        [2880, 90, 45, 90, float("inf")]
    parts = preflight.partitions("gpu*|2-00:00:00|gpu:nvidia_h100_80gb_hbm3:4(S:0-1)\ngpu*|2-00:00:00|gpu:h100:8\n"
                                 "cpu|1-00:00:00|(null)\n")
    assert parts == {"gpu": {"limit_min": 2880, "gres": {"nvidia_h100_80gb_hbm3", "h100"}},
                     "cpu": {"limit_min": 1440, "gres": set()}}


def test_the_sync_folder_is_measured_and_priced_per_trained_model(tmp_path):
    found = preflight.sync_folder_findings(tmp_path / "sync", PAPER, probe_mib=16)
    assert {f.check for f in found} == {"sync folder", "sync speed"}
    assert sum("qwen3_4b" in f.message for f in found) == 2 and "4 ranks" in found[0].message
    assert not list((tmp_path / "sync").iterdir())  # the probe is gone


def test_each_rules_job_size_is_read_as_snakemake_evaluates_the_profile():
    """CPUs, memory and minutes of every rule at its first attempt: ``default-resources`` under the
    rule's own values, expressions of ``attempt`` and ``$PWOPSD_MAX_RUNTIME_MIN`` evaluated (the
    figures here are the profile's, read by hand)."""
    profile = yaml.safe_load((REPO / "profiles/slurm/profile.yaml").read_text())
    from pwopsd.cluster import job_sizes

    sizes, unread = job_sizes(profile, 600)
    assert not unread
    assert sizes["default"] == {"partition": "CHANGE_ME_CPU_PARTITION", "cpus": 2, "mem_mb": 8000, "minutes": 30}
    assert sizes["train"] == {"partition": "CHANGE_ME_GPU_PARTITION", "cpus": 32, "mem_mb": 256000, "minutes": 600}
    assert sizes["merge_adapter"]["mem_mb"] == 64000 and sizes["generate"]["minutes"] == 480
    assert sizes["fit_schedule"] == {"partition": "CHANGE_ME_CPU_PARTITION", "cpus": 1, "mem_mb": 4000, "minutes": 30}
    assert set(sizes) == {"default", *profile["set-resources"]}
    # Snakemake's human-readable values; what cannot be known before the DAG is said, not skipped
    profile["set-resources"]["train"].update(runtime="12h", mem_mb="64GB")
    profile["set-resources"]["grade"]["mem_mb"] = "input.size_mb * 2"
    del profile["default-resources"]["cpus_per_task"]
    sizes, unread = job_sizes(profile, 600)
    assert (sizes["train"]["minutes"], sizes["train"]["mem_mb"]) == (720, 64000)
    assert "'input.size_mb * 2' before the DAG" in unread["grade"]
    assert unread["default"] == "no cpus_per_task in default-resources"
    assert set(sizes) == set(profile["set-resources"]) - {"grade", "grade_sweep_step"}  # one YAML anchor; each sets its CPUs


def test_the_canarys_preflight_reads_the_profile_as_snakemake_parsed_it(tmp_path):
    """In a Slurm run the Snakefile hands the preflight the profile Snakemake parsed (Resource
    objects, not text): partitions, GPU types and sizes are the values written, never a repr."""
    from snakemake.cli import parse_set_resources
    from snakemake.resources import Resources
    from snakemake.settings.types import ResourceSettings

    from pwopsd.cluster import Profile, job_sizes

    text = (REPO / "profiles/slurm/profile.yaml").read_text()
    for placeholder, value in (("CHANGE_ME_ACCOUNT", "acct"), ("CHANGE_ME_CPU_PARTITION", "cpu"),
                               ("CHANGE_ME_GPU_PARTITION", "gpu"), ("CHANGE_ME_GPU_TYPE", "h100")):
        text = text.replace(placeholder, value)
    written = yaml.safe_load(text)
    settings = ResourceSettings(
        overwrite_resources=parse_set_resources([f"{r}:{k}={v}" for r, res in written["set-resources"].items()
                                                 for k, v in res.items()]),
        default_resources=Resources.parse([f"{k}={v}" for k, v in written["default-resources"].items()],
                                          allow_expressions=True, defaults="full"))
    parsed = Profile.from_settings(settings, [])
    profile = {"default-resources": dict(parsed.defaults), "set-resources": {r: dict(v) for r, v in parsed.per_rule.items()}}
    assert preflight.gpu_requests(profile, PAPER)[0][1:3] == ("gpu", "h100")
    cap = PAPER["cluster"]["max_runtime_min"]
    assert job_sizes(profile, cap) == job_sizes(written, cap)


def test_a_node_local_sync_folder_is_measured_on_the_gpu_node_not_the_login_node(tmp_path, monkeypatch):
    """``training.rollout_sync_dir: $TMPDIR`` (the paper's) is the GPU node's disk: the login node's
    preflight says so instead of measuring its own; the node part measures it where it expands."""
    monkeypatch.setenv("TMPDIR", str(tmp_path / "login"))
    cfg = {**PAPER, "training": {**PAPER["training"], "rollout_sync_dir": "$TMPDIR"}}
    found = preflight.cluster_findings({}, cfg)
    (sync,) = [f for f in found if f.check.startswith("sync")]
    assert sync.warn and not sync.ok and "--gpu-job" in sync.message and "$TMPDIR is node-local" in sync.message
    assert not (tmp_path / "login").exists()  # nothing written on the login node
    monkeypatch.setenv("TMPDIR", str(tmp_path / "node"))
    (tmp_path / "node").mkdir()
    on_node = [f for f in preflight.node_main(None, "$TMPDIR", cfg) if f.check.startswith("sync")]
    assert {f.check for f in on_node} == {"sync folder", "sync speed"}
    assert all(f.message.startswith("on GPU node ") and str(tmp_path / "node") in f.message for f in on_node)


def test_node_local_sync_folders_are_keyed_by_the_run_and_never_a_literal_variable(tmp_path, monkeypatch):
    from pwopsd.training.job import sync_base, sync_root

    work = tmp_path / "checkpoints" / "abc123"
    assert sync_base(work) == work / "rollout-sync"
    monkeypatch.setenv("TMPDIR", str(tmp_path / "node"))
    assert sync_root(work, "job-7", "$TMPDIR") == tmp_path / "node" / "pwopsd-rollout-sync" / "abc123" / "job-7"
    monkeypatch.delenv("TMPDIR")
    import tempfile

    tempfile.tempdir = None  # gettempdir caches its answer
    assert "$" not in str(sync_base(work, "$TMPDIR")) and sync_base(work, "$TMPDIR").parent.name == "pwopsd-rollout-sync"


def test_the_preflight_command_names_each_failure_and_exits_1(tmp_path):
    """On this machine (no conda, the profile's CHANGE_ME values, no Hub): exit 1, each failure with
    the setting to change."""
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "pwopsd.preflight", "--sync-dir", str(tmp_path / "sync"), "--json",
                           str(tmp_path / "f.json")], capture_output=True, text=True, cwd=REPO, env=env)
    assert proc.returncode == 1, proc.stderr[-2000:]
    found = json.loads((tmp_path / "f.json").read_text())
    assert any(f["setting"] == "set-resources.generate.gpu_model" and not f["ok"] for f in found)
    assert "-> change: default-resources.slurm_account" in proc.stdout and "checks," in proc.stdout
