"""Anchors of the baselines beyond the paper: GKD's generalized JSD equals TRL's own
`generalized_jsd_loss` (GKDTrainer, TRL pinned in the test extra) in value and gradient on random
logits, for beta 0, 0.5, 0.9 and 1 and temperatures other than 1. ToDi is checked against a naive
float64 computation from its equations in tests/test_losses.py."""

import os

import pytest
import torch

from conftest import unavailable
from pwopsd.training.losses import gkd_loss


@pytest.fixture(scope="module")
def gkd_trainer():
    """TRL's GKD trainer module, imported when a test needs it (7 s of imports: not at collection)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    try:
        import trl.experimental.gkd.gkd_trainer as module
    except ImportError as exc:  # the test extra installs TRL: in CI a missing one fails
        unavailable(f"TRL's GKD trainer cannot be imported: {exc}")
    return module


def logits(seed, B=3, T=6, V=29, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    zs = (torch.randn(B, T, V, generator=g, dtype=dtype) * 3).requires_grad_(True)
    zt = torch.randn(B, T, V, generator=g, dtype=dtype) * 3
    mask = torch.ones(B, T)
    mask[0, 4:] = 0
    mask[2, :2] = 0
    return zs, zt, mask


@pytest.mark.parametrize("beta", [0.0, 0.5, 0.9, 1.0])  # 0.9: the mixture's orientation (0.5 is symmetric)
@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_gkd_equals_trls_generalized_jsd(beta, temperature, gkd_trainer):
    zs, zt, mask = logits(int(beta * 10) + int(temperature * 10))
    labels = torch.where(mask > 0, torch.zeros_like(mask, dtype=torch.long), torch.full_like(mask, -100, dtype=torch.long))
    theirs = gkd_trainer.GKDTrainer.generalized_jsd_loss(zs, zt, labels=labels, beta=beta, temperature=temperature,
                                                          reduction="batchmean")
    ours = gkd_loss(zs, zt, mask, temperature=temperature, clip=None, beta=beta)
    (g_theirs,) = torch.autograd.grad(theirs, zs)
    (g_ours,) = torch.autograd.grad(ours, zs)
    assert float(ours) == pytest.approx(float(theirs), rel=1e-5, abs=1e-7)
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-4, atol=1e-7)
    assert float(ours) > 0
