"""Merging a trained LoRA adapter into its base checkpoint (rule ``merge_adapter``), file to file.

The result is what PEFT's ``PeftModel.from_pretrained(base, adapter).merge_and_unload()`` followed
by ``save_pretrained`` writes on a CPU, weight for weight (tested bit for bit in float32 and
bfloat16, one file or shards), but it reads and writes safetensors directly: no model class is
built, so the job needs neither transformers nor PEFT (their import was most of a tiny merge job's
four seconds), and a sharded checkpoint is merged one shard at a time.

PEFT's arithmetic on a CPU: the adapter's matrices are float32 (PEFT's ``autocast_adapter_dtype``
loads bf16/fp16 adapters as float32), the update ``(B @ A) * scaling`` (transposed first for
``fan_in_fan_out``) is computed in float32 and added in place to the base weight, which rounds the
sum once to the weight's dtype. ``scaling`` is ``lora_alpha / r`` (``/ sqrt(r)`` with rsLoRA).
Adapter features this project's training never produces (DoRA, bias terms, per-module ranks, saved
modules) are refused with the adapter config's key rather than merged wrongly.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from pwopsd.io import atomic_path
from pwopsd.models import WEIGHT_FILES  # the merged folder writes its own; every other file is copied

INDEX = "model.safetensors.index.json"
ADAPTER_PREFIX = "base_model.model."

# adapter_config.json keys whose non-default values this merge does not implement.
UNSUPPORTED = {"use_dora": False, "lora_bias": False, "bias": "none", "modules_to_save": None, "rank_pattern": {},
               "alpha_pattern": {}, "layer_replication": None, "trainable_token_indices": None,
               "target_parameters": None, "use_qalora": False}


class MergeError(ValueError):
    """The adapter or the base checkpoint is not one this merge handles; the message names it."""


def lora_scaling(adapter_config: dict) -> float:
    """The factor of a LoRA update: ``lora_alpha / r``, or ``lora_alpha / sqrt(r)`` with rsLoRA."""
    if adapter_config.get("peft_type", "LORA") != "LORA":
        raise MergeError(f"adapter_config.json: peft_type {adapter_config['peft_type']!r} is not LORA")
    for key, default in UNSUPPORTED.items():
        value = adapter_config.get(key, default)
        if value != default and not (default == {} and value is None):
            raise MergeError(f"adapter_config.json: {key}={adapter_config[key]!r} is not supported by the merge "
                             f"(only plain LoRA: {key}={default!r})")
    r, alpha = int(adapter_config["r"]), float(adapter_config["lora_alpha"])
    return alpha / math.sqrt(r) if adapter_config.get("use_rslora") else alpha / r


def merged_weight(weight, lora_a, lora_b, scaling: float, fan_in_fan_out: bool = False):
    """One LoRA layer merged as PEFT merges it on a CPU: ``weight + (B @ A) * scaling`` with the
    update in float32, rounded once to ``weight``'s dtype."""
    delta = lora_b.float() @ lora_a.float()
    if fan_in_fan_out:
        delta = delta.T
    out = weight.clone()
    out += delta * scaling
    return out


def _adapter_layers(adapter: dict) -> dict[str, tuple]:
    """Base weight name -> (lora_A, lora_B) from an adapter's saved tensors."""
    layers: dict[str, dict] = {}
    for key, value in adapter.items():
        for part in ("lora_A", "lora_B"):
            suffix = f".{part}.weight"
            if key.startswith(ADAPTER_PREFIX) and key.endswith(suffix):
                layers.setdefault(key[len(ADAPTER_PREFIX) : -len(suffix)] + ".weight", {})[part] = value
                break
        else:
            raise MergeError(f"adapter tensor {key!r} is not a LoRA A or B matrix of the base model")
    incomplete = [name for name, parts in layers.items() if len(parts) != 2]
    if incomplete:
        raise MergeError(f"adapter layers without both LoRA matrices: {incomplete[:3]}")
    return {name: (parts["lora_A"], parts["lora_B"]) for name, parts in layers.items()}


def merge_lora_checkpoint(base_dir: str | Path, adapter_dir: str | Path, out_dir: str | Path, dtype: str) -> Path:
    """Write ``out_dir``: the base checkpoint's weights in ``dtype`` (as ``from_pretrained(dtype=)``
    would hold them) with the adapter merged, its other files copied, ``config.json``'s dtype set.
    Atomic: ``out_dir`` appears complete or not at all."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    base, adapter_dir = Path(base_dir), Path(adapter_dir)
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    scaling, fan_in_fan_out = lora_scaling(config), bool(config.get("fan_in_fan_out", False))
    layers = _adapter_layers(load_file(str(adapter_dir / "adapter_model.safetensors")))
    target = getattr(torch, dtype)
    index = json.loads((base / INDEX).read_text()) if (base / INDEX).exists() else None
    shards = sorted(set(index["weight_map"].values())) if index else ["model.safetensors"]
    if not all((base / s).is_file() for s in shards):
        raise MergeError(f"{base}: no safetensors weights ({', '.join(shards)})")
    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        sizes = {}
        for shard in shards:
            with safe_open(str(base / shard), "pt") as fh:
                metadata = fh.metadata()
                tensors = {name: fh.get_tensor(name).to(target) for name in fh.keys()}
            for name in set(tensors) & set(layers):
                lora_a, lora_b = layers.pop(name)
                tensors[name] = merged_weight(tensors[name], lora_a, lora_b, scaling, fan_in_fan_out)
            save_file(tensors, str(tmp / shard), metadata=metadata)
            sizes.update({name: t.numel() * t.element_size() for name, t in tensors.items()})
        if layers:
            raise MergeError(f"adapter layers with no weight of that name in {base}: {sorted(layers)[:3]}")
        if index:
            index = {**index, "metadata": {**index.get("metadata", {}), "total_size": sum(sizes.values())}}
            (tmp / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        for f in sorted(base.iterdir()):
            if f.is_file() and not any(f.match(p) for p in WEIGHT_FILES):
                shutil.copyfile(f, tmp / f.name)  # follows the Hub cache's links
        model_config = json.loads((tmp / "config.json").read_text())
        for key in ("dtype", "torch_dtype"):
            if key in model_config or key == "dtype":
                model_config[key] = dtype
        (tmp / "config.json").write_text(json.dumps(model_config, indent=2, sort_keys=True) + "\n")
    return Path(out_dir)
