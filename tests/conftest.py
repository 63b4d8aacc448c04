import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
BENCHMARKS = SHARED / "data" / "benchmarks"
SPEC = SHARED / "spec"

sys.path.insert(0, str(REPO / "src"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def require_shared(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} not available (shared data lives beside the checkout)")
    return path


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from pwopsd.tiny.model import TinyBuildConfig, build_tokenizer, tokenizer_corpus

    cfg = TinyBuildConfig()
    return build_tokenizer(tokenizer_corpus(cfg, n=600), cfg.vocab_size)


@pytest.fixture(scope="session")
def random_tiny_model(tiny_tokenizer):
    """A randomly initialized (untrained) tiny Qwen3: enough for backend mechanics."""
    import torch

    from pwopsd.tiny.model import TinyBuildConfig, build_model

    torch.set_num_threads(2)
    cfg = TinyBuildConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                          num_key_value_heads=1, head_dim=32, seed=3)
    return build_model(cfg, tiny_tokenizer).eval()
