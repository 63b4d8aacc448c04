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


RESOLVE = """
import json, sys
import huggingface_hub, transformers  # imported first, as in a job: both read HF_HUB_OFFLINE at import
from pwopsd.models import ModelError, resolve_hub_model
try:
    print(json.dumps(resolve_hub_model("tiny", hf_id=sys.argv[2], revision=sys.argv[3],
                                       hub={"cache_dir": sys.argv[1], "offline": True})))
except ModelError as exc:
    print("ModelError:", exc)
"""


@pytest.mark.parametrize("repo", ["org/tiny", "org/absent"])
def test_hub_offline_never_asks_the_hub_even_when_the_variable_is_set_too_late(repo, tmp_path, random_tiny_model,
                                                                               tiny_tokenizer):
    """``hub.offline: true`` without ``HF_HUB_OFFLINE`` in the job's environment (a compute node with no
    internet, or one with internet that must not use it): a model in the cache resolves, one not in
    it fails naming the key, and neither sends one request to the Hub (a local endpoint that counts)."""
    import http.server
    import subprocess
    import sys
    import threading

    _fake_hub_cache(tmp_path, random_tiny_model, tiny_tokenizer)
    seen = []

    class Hub(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            seen.append(self.path)
            self.send_response(503)
            self.end_headers()

        do_HEAD = do_GET  # noqa: N815

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env["HF_ENDPOINT"] = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        out = subprocess.run([sys.executable, "-c", RESOLVE, str(tmp_path), repo, SHA], capture_output=True, text=True,
                             env=env, timeout=300)
    finally:
        server.shutdown()
    assert out.returncode == 0, out.stderr[-2000:]
    assert seen == [], f"requests to the Hub: {seen}"
    if repo == "org/tiny":
        assert '"resolved_commit": "' + SHA in out.stdout
    else:
        assert "ModelError: models.tiny.hf_id: could not fetch org/absent" in out.stdout and "cache only" in out.stdout
