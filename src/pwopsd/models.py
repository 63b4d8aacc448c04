"""Model checkpoints: resolving, recording and loading them.

Every model a rule uses is described by a small *model manifest* JSON
(``results/models/{model}/base.json``): where the weights are on disk, which Hub id and
revision (or which build) they come from, and checksums. Hub models are resolved with
``huggingface_hub.snapshot_download`` (pinned revision, cache dir, ``HF_HUB_OFFLINE`` honoured);
tiny models point at the directory their build rule wrote.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

WEIGHT_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken"]
# Files of a checkpoint folder that hold weights (a merged or re-weighted copy writes its own).
WEIGHT_FILES = ("*.safetensors", "*.safetensors.index.json", "*.bin", "*.bin.index.json", "*.pt", "*.pth")


class ModelError(RuntimeError):
    """A model could not be resolved or loaded; the message names the config key."""


def _lfs_sha256(path: Path) -> str | None:
    """HF cache blobs of LFS files are named by their SHA-256; read it off the symlink target."""
    target = Path(os.path.realpath(path)).name
    return target if len(target) == 64 and all(c in "0123456789abcdef" for c in target) else None


def resolve_hub_model(name: str, *, hf_id: str, revision: str, hub: dict) -> dict[str, Any]:
    """Download (or find in the cache) a Hub model at its pinned revision; return its manifest.

    ``hub.offline`` (or ``HF_HUB_OFFLINE=1``) reads the cache only: ``local_files_only``, since
    huggingface_hub reads ``HF_HUB_OFFLINE`` once, when it is first imported, and a job has
    imported it by now (through transformers): setting the variable here alone left every fetch
    job making its requests and retries before it fell back to the cache (issue 42: 11 failed
    requests, 23.6 s; once 16 minutes). The variable is still set for the libraries a job
    imports later."""
    offline = bool(hub.get("offline")) or os.environ.get("HF_HUB_OFFLINE") == "1"
    if offline:
        os.environ["HF_HUB_OFFLINE"] = "1"
    from huggingface_hub import snapshot_download

    try:
        path = snapshot_download(
            repo_id=hf_id,
            revision=revision,
            cache_dir=hub.get("cache_dir"),
            allow_patterns=WEIGHT_PATTERNS,
            local_files_only=offline,
        )
    except Exception as exc:
        raise ModelError(
            f"models.{name}.hf_id: could not fetch {hf_id} at revision {revision} "
            f"(HF_HUB_OFFLINE={1 if offline else 0}{', the cache only: is it in hub.cache_dir?' if offline else ''}): "
            f"{type(exc).__name__}: {exc}"
        ) from None
    root = Path(path)
    files = {}
    for f in sorted(root.rglob("*")):
        if f.is_file():
            files[str(f.relative_to(root))] = _lfs_sha256(f)
    return {
        "model": name,
        "kind": "hub",
        "path": str(root),
        "hf_id": hf_id,
        "revision": revision,
        "resolved_commit": root.name,
        "files_sha256": files,
    }


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    with open(path) as fh:
        return json.load(fh)


def torch_dtype(name: str):
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def load_tokenizer(manifest: dict):
    from transformers import AutoTokenizer

    path = manifest["path"]
    if not Path(path).exists():
        raise ModelError(f"model {manifest.get('model')}: checkpoint directory {path} does not exist")
    return AutoTokenizer.from_pretrained(path)


def load_model(manifest: dict, device: str = "cpu", dtype: str = "float32"):
    """Load a causal LM from a manifest's local path in the configured dtype."""
    from transformers import AutoModelForCausalLM

    path = manifest["path"]
    if not Path(path).exists():
        raise ModelError(f"model {manifest.get('model')}: checkpoint directory {path} does not exist")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype))
    return model.to(device).eval()


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_checkpoint(manifest_path: str | os.PathLike, dtype: str):
    """``(manifest, model, tokenizer)`` of a checkpoint, the model on the default device."""
    manifest = read_manifest(manifest_path)
    return manifest, load_model(manifest, device=default_device(), dtype=dtype), load_tokenizer(manifest)


def decoder_layers(model, path: str = "model.layers") -> list:
    """The decoder blocks of a causal LM at the attribute ``path`` of its model entry (``layers``,
    default ``model.layers``: Qwen3, Llama, Olmo), also through a PEFT wrapper."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    inner = base
    for part in path.split("."):
        if not hasattr(inner, part):
            raise ModelError(f"the model ({type(base).__name__}) has no attribute path {path!r} to its decoder layers: "
                             "set `layers` of its model entry")
        inner = getattr(inner, part)
    return list(inner)
