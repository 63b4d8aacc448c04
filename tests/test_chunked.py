"""The chunked training-path losses equal the reference forms in value and gradients."""

import pytest
import torch

from pwopsd.training import chunked as C
from pwopsd.training import losses as L
from pwopsd.training.registry import loss_keywords as kw


def setup(seed=0, B=3, T=9, H=8, V=23):
    g = torch.Generator().manual_seed(seed)
    h_s = torch.randn(B, T, H, generator=g, dtype=torch.float64, requires_grad=True)
    h_t = torch.randn(B, T, H, generator=g, dtype=torch.float64)
    W = torch.randn(V, H, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, V, (B, T), generator=g)
    mask = torch.ones(B, T)
    mask[0, 6:] = 0
    mask[1, 1:] = 0  # single token
    mask[2, :2] = 0
    return h_s, h_t, W, tokens, mask


def check(ref_fn, chunk_fn, h_s, *, rtol=2e-6):  # both paths compute in fp32, as the reference
    ref = ref_fn()
    (g_ref,) = torch.autograd.grad(ref, h_s)
    got = chunk_fn()
    (g_got,) = torch.autograd.grad(got, h_s)
    assert float(got.detach()) == pytest.approx(float(ref.detach()), rel=rtol, abs=1e-12)
    torch.testing.assert_close(g_got.double(), g_ref.double(), rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("chunk", [1, 4, 1000])
def test_opsd(chunk):
    h_s, h_t, W, tokens, mask = setup()
    check(lambda: L.opsd_loss(h_s @ W.T, h_t @ W.T, mask, **kw("opsd")),
          lambda: C.opsd_loss_chunked(h_s, h_t, W, mask, chunk_size=chunk, **kw("opsd")), h_s)


@pytest.mark.parametrize("reduction", ["per_sequence", "global"])
@pytest.mark.parametrize("chunk", [3, 64])
def test_pwopsd(reduction, chunk):
    h_s, h_t, W, tokens, mask = setup(1)
    p = kw("pwopsd", w_min=0.05, tau=0.5, s=0.05, reduction=reduction)
    check(lambda: L.pwopsd_loss(h_s @ W.T, h_t @ W.T, mask, **p),
          lambda: C.pwopsd_loss_chunked(h_s, h_t, W, mask, chunk_size=chunk, **p), h_s)


def test_eopd():
    h_s, h_t, W, tokens, mask = setup(2)
    p = kw("eopd", entropy_threshold=2.5, top_k=5)
    check(lambda: L.eopd_loss(h_s @ W.T, h_t @ W.T, tokens, mask, **p),
          lambda: C.eopd_loss_chunked(h_s, h_t, W, tokens, mask, chunk_size=4, **p), h_s)


@pytest.mark.parametrize("step", [0, 60])
def test_reopold(step):
    h_s, h_t, W, tokens, mask = setup(3)
    check(lambda: L.reopold_loss(h_s @ W.T, h_t @ W.T, tokens, mask, step=step, **kw("reopold")),
          lambda: C.reopold_loss_chunked(h_s, h_t, W, tokens, mask, step=step, chunk_size=5, **kw("reopold")), h_s)


@pytest.mark.parametrize("loss, beta", [("gkd", 0.0), ("gkd", 0.5), ("gkd", 0.9), ("gkd", 1.0),
                                        ("todi", 0.5), ("todi", 1.0), ("todi", 3.0)])
@pytest.mark.parametrize("clip", [0.05, None])
def test_baselines_beyond_the_paper(loss, beta, clip):
    h_s, h_t, W, tokens, mask = setup(6)
    p = kw(loss, beta=beta, clip=clip)
    check(lambda: getattr(L, f"{loss}_loss")(h_s @ W.T, h_t @ W.T, mask, **p),
          lambda: getattr(C, f"{loss}_loss_chunked")(h_s, h_t, W, mask, chunk_size=3, **p), h_s)


def test_every_registered_loss_has_a_schema_branch_and_a_reference_form():
    """The registry, the schema's loss enum and its per-loss parameter branches, and the reference
    forms name the same losses: a method is a reference loss, a chunked form with its registry
    entry, a schema branch and a config entry (README, "Where to add...")."""
    from pwopsd.config import load_schema, schema_defaults

    schema = load_schema()
    method = schema["properties"]["methods"]["additionalProperties"]
    enum = method["properties"]["loss"]["enum"]
    branches = [b["if"]["properties"]["loss"]["const"] for b in method["allOf"]]
    assert sorted(C.LOSSES) == sorted(enum) == sorted(branches)
    for name in C.LOSSES:
        assert callable(getattr(L, f"{name}_loss"))
        assert isinstance(schema_defaults("methods", {"loss": name})["params"], dict)


def test_all_invalid_batch():
    h_s, h_t, W, tokens, _ = setup(4)
    mask = torch.zeros(h_s.shape[:2])
    for loss in (C.opsd_loss_chunked(h_s, h_t, W, mask, chunk_size=4, **kw("opsd")),
                 C.pwopsd_loss_chunked(h_s, h_t, W, mask, chunk_size=4, **kw("pwopsd")),
                 C.eopd_loss_chunked(h_s, h_t, W, tokens, mask, chunk_size=4, **kw("eopd")),
                 C.reopold_loss_chunked(h_s, h_t, W, tokens, mask, step=0, chunk_size=4, **kw("reopold")),
                 C.gkd_loss_chunked(h_s, h_t, W, mask, chunk_size=4, **kw("gkd")),
                 C.todi_loss_chunked(h_s, h_t, W, mask, chunk_size=4, **kw("todi"))):
        assert float(loss) == 0.0 and loss.requires_grad


def test_gradient_to_a_trainable_head_matches():
    h_s, h_t, W, tokens, mask = setup(5)
    W1 = W.clone().requires_grad_(True)
    W2 = W.clone().requires_grad_(True)
    L.opsd_loss(h_s @ W1.T, h_t @ W1.T, mask, **kw("opsd")).backward()
    C.opsd_loss_chunked(h_s, h_t, W2, mask, chunk_size=4, **kw("opsd")).backward()
    torch.testing.assert_close(W2.grad, W1.grad, rtol=1e-6, atol=1e-9)
