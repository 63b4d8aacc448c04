"""Hub model resolution through a real (locally built) Hugging Face cache in offline mode, the
clear error when a model is missing, and loading from a manifest."""

import hashlib
import os

import pytest
import torch

from pwopsd.models import ModelError, load_model, load_tokenizer, resolve_hub_model

SHA = "0123456789abcdef0123456789abcdef01234567"


def _fake_hub_cache(cache, model, tokenizer, repo="org/tiny"):
    """Lay out ``cache`` the way huggingface_hub stores a downloaded snapshot (blobs + symlinks)."""
    staging = cache / "staging"
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    root = cache / ("models--" + repo.replace("/", "--"))
    snap = root / "snapshots" / SHA
    (root / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in staging.iterdir():
        data = f.read_bytes()
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snap), snap / f.name)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(SHA)
    return hashlib.sha256((staging / "model.safetensors").read_bytes()).hexdigest()


def test_offline_resolution_from_cache_and_loading(tmp_path, monkeypatch, random_tiny_model, tiny_tokenizer):
    weights_sha = _fake_hub_cache(tmp_path, random_tiny_model, tiny_tokenizer)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    manifest = resolve_hub_model("tiny", hf_id="org/tiny", revision=SHA, hub={"cache_dir": str(tmp_path), "offline": True})
    assert manifest["resolved_commit"] == SHA
    assert manifest["files_sha256"]["model.safetensors"] == weights_sha
    model = load_model(manifest, dtype="float32")
    tok = load_tokenizer(manifest)
    x = torch.tensor([tok("Compute 1 + 2.")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, random_tiny_model(x).logits)


def test_missing_model_offline_names_the_key(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match=r"models\.qwen3_4b\.hf_id: could not fetch Qwen/Qwen3-4B at revision 1cfa9a7.*HF_HUB_OFFLINE=1"):
        resolve_hub_model("qwen3_4b", hf_id="Qwen/Qwen3-4B", revision="1cfa9a7208912126459214e8b04321603b3df60c",
                          hub={"cache_dir": str(tmp_path), "offline": True})


def test_missing_checkpoint_directory(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        load_model({"model": "m", "path": str(tmp_path / "none")})
