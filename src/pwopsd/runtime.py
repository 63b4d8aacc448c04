"""Process set-up shared by the workflow scripts: logging into the rule's log file, thread
counts, and the provenance block every result file carries."""

from __future__ import annotations

import logging
import os
import platform
import sys
from importlib import metadata


def setup_logging(log_path: str | None = None, level: int = logging.INFO) -> logging.Logger:
    """Send logging (and stderr, so tracebacks and progress bars land there too) to ``log_path``."""
    if log_path:
        os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
        stream = open(log_path, "a", buffering=1)
        sys.stderr = stream
        logging.basicConfig(stream=stream, level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    else:
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return logging.getLogger("pwopsd")


def set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(max(1, int(n)))


PACKAGES = ("pwopsd", "torch", "transformers", "tokenizers", "peft", "accelerate", "datasets", "huggingface_hub",
            "numpy", "pandas", "pyarrow", "math-verify", "vllm", "snakemake")


def versions() -> dict[str, str]:
    """Versions of the packages that can influence a result (absent ones are left out)."""
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def provenance(manifest: dict | None = None, **extra) -> dict:
    """The provenance block of a result file: package versions, the model id and revision, plus
    whatever settings produced it (``extra``)."""
    out = {"versions": versions(), **extra}
    if manifest is not None:
        out.update(model_path=manifest.get("path"), hf_id=manifest.get("hf_id"), revision=manifest.get("revision"))
    return out
