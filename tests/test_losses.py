"""Losses against independent naive computations (float64, explicit loops over rows and tokens):
values and gradients, masked rows, single-token rows, all-invalid batches; the schedule values of
the spec; per-sequence vs global reduction; the REOPOLD phase switch; the EOPD gate."""

import math

import pytest
import torch

from pathlib import Path

from pwopsd.config import load_config
from pwopsd.training.registry import loss_keywords
from pwopsd.training.losses import (
    eopd_loss,
    gkd_loss,
    opsd_loss,
    position_weights,
    pwopsd_loss,
    reopold_floor,
    reopold_loss,
    schedule_weight,
    todi_loss,
)

# The paper's four schedules as the paper config declares them (w_min, tau, s).
_PAPER = load_config(Path(__file__).resolve().parents[1] / "config" / "config.yaml")["methods"]
SCHEDULES = {n: tuple(_PAPER[f"pwopsd_{n}"]["params"][k] for k in ("w_min", "tau", "s"))
             for n in ("mild", "moderate", "sharp", "aggressive")}

SPEC_WEIGHTS = {  # ../shared/spec/reference_implementation.md §2.2, r = 0, .1, .25, .3, .5, .75, 1
    "mild": [0.6345, 0.6888, 0.7811, 0.8112, 0.9088, 0.9700, 0.9910],
    "moderate": [0.2856, 0.3394, 0.5332, 0.6250, 0.9106, 0.9918, 0.9993],
    "sharp": [0.1003, 0.1022, 0.1427, 0.2073, 0.8927, 0.9992, 1.0],
    "aggressive": [0.0500, 0.0503, 0.0564, 0.0671, 0.5250, 0.9936, 1.0],
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_the_paper_configs_schedules_match_the_spec(name):
    w_min, tau, s = SCHEDULES[name]
    r = torch.tensor([0, 0.1, 0.25, 0.3, 0.5, 0.75, 1.0], dtype=torch.float64)
    got = schedule_weight(r, w_min=w_min, tau=tau, s=s)
    assert got.tolist() == pytest.approx(SPEC_WEIGHTS[name], abs=5e-5)


def batch(seed=0, B=4, T=7, V=11):
    g = torch.Generator().manual_seed(seed)
    zs = (torch.randn(B, T, V, generator=g, dtype=torch.float64) * 2).requires_grad_(True)
    zt = torch.randn(B, T, V, generator=g, dtype=torch.float64) * 2
    tokens = torch.randint(0, V, (B, T), generator=g)
    mask = torch.ones(B, T)
    mask[0, 5:] = 0  # padded tail
    mask[1, :] = 0  # fully masked row
    mask[2, 1:] = 0  # single-token row
    mask[3, 0] = 0  # masked head (prompt side)
    return zs, zt, tokens, mask


def naive_token_kl(zs, zt, b, t, temperature, clip):
    ps = torch.softmax(zs[b, t] / temperature, -1)
    pt = torch.softmax(zt[b, t] / temperature, -1)
    total = 0.0
    for j in range(zs.shape[-1]):
        e = pt[j] * (torch.log(pt[j]) - torch.log(ps[j]))
        total = total + (torch.clamp(e, max=clip) if clip is not None else e)
    return total


def naive_weight(mask, b, t, w_min, tau, s):
    L = int(mask[b].sum())
    k = int(mask[b, : t + 1].sum())
    r = (k - 0.5) / L
    return w_min + (1 - w_min) / (1 + math.exp(-(r - tau) / s))


def valid_positions(mask):
    return [(b, t) for b in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[b, t] > 0]


def assert_same_value_and_grad(ours, naive, zs):
    (g1,) = torch.autograd.grad(ours, zs, retain_graph=True)
    (g2,) = torch.autograd.grad(naive, zs)
    assert float(ours.detach()) == pytest.approx(float(naive.detach()), rel=1e-6, abs=1e-9)
    torch.testing.assert_close(g1.double(), g2, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("clip", [0.05, None])
def test_opsd_loss(clip):
    zs, zt, _, mask = batch()
    pos = valid_positions(mask)
    naive = sum(naive_token_kl(zs, zt, b, t, 1.1, clip) for b, t in pos) / len(pos)
    assert_same_value_and_grad(opsd_loss(zs, zt, mask, **loss_keywords("opsd", temperature=1.1, clip=clip)), naive, zs)


def test_clip_is_an_upper_clamp_only():
    zs, zt, _, mask = batch(1)
    assert opsd_loss(zs, zt, mask, **loss_keywords("opsd", clip=0.05)) < opsd_loss(zs, zt, mask, **loss_keywords("opsd", clip=None))
    assert float(opsd_loss(zs, zs.detach(), mask, **loss_keywords("opsd"))) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("name", ["moderate", "aggressive"])
@pytest.mark.parametrize("reduction", ["per_sequence", "global"])
def test_pwopsd_loss(name, reduction):
    w_min, tau, s = SCHEDULES[name]
    zs, zt, _, mask = batch(2)
    rows = {}
    for b, t in valid_positions(mask):
        rows.setdefault(b, []).append(naive_weight(mask, b, t, w_min, tau, s) * naive_token_kl(zs, zt, b, t, 1.1, 0.05))
    if reduction == "per_sequence":
        naive = sum(sum(v) / len(v) for v in rows.values()) / len(rows)  # rows with L_i > 0 only
    else:
        naive = sum(sum(v) for v in rows.values()) / sum(len(v) for v in rows.values())
    ours = pwopsd_loss(zs, zt, mask, **loss_keywords("pwopsd", temperature=1.1, clip=0.05, w_min=w_min, tau=tau, s=s, reduction=reduction))
    assert_same_value_and_grad(ours, naive, zs)


def test_position_weights_use_each_rows_own_length():
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [0, 1, 1, 0, 0, 0]])
    w = position_weights(mask, w_min=0.25, tau=0.3, s=0.1)
    for b, t in valid_positions(mask):
        assert float(w[b, t]) == pytest.approx(naive_weight(mask, b, t, 0.25, 0.3, 0.1), rel=1e-6)
    assert (w[mask == 0] == 0).all()


def test_uniform_weights_per_sequence_vs_global_reduction():
    zs, zt, _, mask = batch(3)
    # w_min = 1 makes w = 1: global reduction equals OPSD; per-sequence weighs rows equally instead.
    g = pwopsd_loss(zs, zt, mask, **loss_keywords("pwopsd", w_min=1.0, reduction="global"))
    p = pwopsd_loss(zs, zt, mask, **loss_keywords("pwopsd", w_min=1.0, reduction="per_sequence"))
    assert float(g) == pytest.approx(float(opsd_loss(zs, zt, mask, **loss_keywords("opsd"))), rel=1e-9)
    assert float(g) != pytest.approx(float(p), rel=1e-3)


def test_all_invalid_batch_gives_zero_with_grad():
    zs, zt, tokens, _ = batch(4)
    mask = torch.zeros(zs.shape[:2])
    for loss in (opsd_loss(zs, zt, mask, **loss_keywords("opsd")), pwopsd_loss(zs, zt, mask, **loss_keywords("pwopsd")),
                 pwopsd_loss(zs, zt, mask, **loss_keywords("pwopsd", reduction="global")),
                 eopd_loss(zs, zt, tokens, mask, **loss_keywords("eopd")),
                 reopold_loss(zs, zt, tokens, mask, step=0, **loss_keywords("reopold")),
                 reopold_loss(zs, zt, tokens, mask, step=99, **loss_keywords("reopold")),
                 gkd_loss(zs, zt, mask, **loss_keywords("gkd")), todi_loss(zs, zt, mask, **loss_keywords("todi"))):
        assert float(loss) == 0.0 and loss.requires_grad
        loss.backward()
    assert torch.count_nonzero(zs.grad) == 0


def test_eopd_loss_against_naive_and_its_gate():
    zs, zt, tokens, mask = batch(5)
    T = 1.1

    def naive(threshold):
        total, n = 0.0, 0
        for b, t in valid_positions(mask):
            lps = torch.log_softmax(zs[b, t] / T, -1)
            lpt = torch.log_softmax(zt[b, t] / T, -1)
            y = int(tokens[b, t])
            adv = lpt[y] - lps[y].detach()
            ratio = torch.exp(lps[y] - lps[y].detach())
            l_opd = torch.maximum(-ratio * adv, -torch.clamp(ratio, 0.8, 1.2) * adv)
            top = torch.argsort(zt[b, t], descending=True)[:4]
            p_top = torch.softmax(zt[b, t, top] / T, -1)
            l_fkl = sum(p_top[k] * (torch.log(p_top[k]) - lps[top[k]]) for k in range(4))
            h = -(lpt.exp() * lpt).sum()
            total = total + l_opd + (l_fkl if h > threshold else 0.0)
            n += 1
        return total / n

    for threshold in (0.0, 1.5, 100.0):  # gate always on / sometimes / never
        ours = eopd_loss(zs, zt, tokens, mask, temperature=T, entropy_threshold=threshold, top_k=4, ppo_eps=0.2)
        assert_same_value_and_grad(ours, naive(threshold), zs)
    on = eopd_loss(zs, zt, tokens, mask, **loss_keywords("eopd", entropy_threshold=0.0, top_k=4))
    off = eopd_loss(zs, zt, tokens, mask, **loss_keywords("eopd", entropy_threshold=100.0, top_k=4))
    assert float(on) > float(off)  # the gated forward KL adds a non-negative term


def test_reopold_floor():
    assert reopold_floor(0.1) == pytest.approx(-2.558428, abs=1e-6)
    with pytest.raises(ValueError):
        reopold_floor(1.0)


@pytest.mark.parametrize("step", [0, 49, 50, 120])
def test_reopold_phases_against_naive(step):
    zs, zt, tokens, mask = batch(6, T=9, V=7)
    T, floor = 1.1, reopold_floor(0.1)
    pos = valid_positions(mask)
    lps = {p: torch.log_softmax(zs[p] / T, -1) for p in pos}
    lpt = {p: torch.log_softmax(zt[p] / T, -1) for p in pos}
    y = {p: int(tokens[p]) for p in pos}
    reward = {p: float(lpt[p][y[p]] - lps[p][y[p]]) for p in pos}
    if step < 50:
        keep = {p for p in pos if reward[p] >= floor}
    else:
        ent = {p: float(-(lps[p].exp() * lps[p]).sum()) for p in pos}
        q = torch.quantile(torch.tensor([ent[p] for p in pos], dtype=torch.float64), 0.8)
        keep = {p for p in pos if ent[p] >= q}
    naive = -sum(max(reward[p], floor) * lps[p][y[p]] for p in keep) / max(len(keep), 1)
    ours = reopold_loss(zs, zt, tokens, mask, temperature=T, lam=0.1, beta=0.2, step=step, t_switch=50)
    assert_same_value_and_grad(ours, naive, zs)
    assert 0 < len(keep) < len(pos)  # both phases drop some tokens on this batch


# ---------------------------------------------------------------------------------------------
# Baselines beyond the paper: ToDi from its equations, GKD at its endpoints (TRL's own function is
# the anchor of tests/test_baseline_anchors.py).


def naive_todi_token(zs, zt, b, t, temperature, beta, clip):
    """ToDi at one position, entry by entry in float64: alpha_j = sigmoid(beta log(p_j / q_j)) as a
    constant, alpha_j p_j log(p_j / q_j) + (1 - alpha_j) q_j log(q_j / p_j), each clamped at clip."""
    q = torch.softmax(zs[b, t] / temperature, -1)  # student
    p = torch.softmax(zt[b, t] / temperature, -1)  # teacher
    total = 0.0
    for j in range(zs.shape[-1]):
        ratio = math.log(float(p[j])) - math.log(float(q[j].detach()))
        alpha = 1.0 / (1.0 + math.exp(-beta * ratio))
        e = alpha * p[j] * (torch.log(p[j]) - torch.log(q[j])) + (1 - alpha) * q[j] * (torch.log(q[j]) - torch.log(p[j]))
        total = total + (torch.clamp(e, max=clip) if clip is not None else e)
    return total


@pytest.mark.parametrize("beta", [0.5, 1.0, 4.0])
@pytest.mark.parametrize("clip", [0.05, None])
def test_todi_loss_against_its_equations(beta, clip):
    zs, zt, _, mask = batch(6)
    pos = valid_positions(mask)
    naive = sum(naive_todi_token(zs, zt, b, t, 0.7, beta, clip) for b, t in pos) / len(pos)
    assert_same_value_and_grad(todi_loss(zs, zt, mask, temperature=0.7, clip=clip, beta=beta), naive, zs)


def test_todi_weights_forward_kl_where_the_student_underestimates():
    """With a large beta the weight is a step: ToDi is then the forward-KL term on the entries the
    student underestimates plus the reverse-KL term on those it overestimates."""
    zs, zt, _, mask = batch(7)
    T = 1.0
    ps, pt = torch.softmax(zs / T, -1), torch.softmax(zt / T, -1)
    under = (pt > ps).double()
    fkl = pt * (pt.log() - ps.log())
    rkl = ps * (ps.log() - pt.log())
    per_token = (under * fkl + (1 - under) * rkl).sum(-1)
    m = mask.double()
    expected = (per_token * m).sum() / m.sum()
    got = todi_loss(zs, zt, mask, temperature=T, clip=None, beta=1e4)
    assert float(got) == pytest.approx(float(expected), rel=1e-6)


def test_gkd_at_beta_0_is_opsd_and_at_beta_1_the_reverse_kl():
    zs, zt, _, mask = batch(8)
    for clip in (0.05, None):
        assert float(gkd_loss(zs, zt, mask, temperature=1.1, clip=clip, beta=0.0)) == pytest.approx(
            float(opsd_loss(zs, zt, mask, temperature=1.1, clip=clip)), rel=1e-12)
    ps, pt = torch.softmax(zs / 1.1, -1), torch.softmax(zt / 1.1, -1)
    rkl = (ps * (ps.log() - pt.log())).sum(-1)
    m = mask.double()
    assert float(gkd_loss(zs, zt, mask, temperature=1.1, clip=None, beta=1.0)) == pytest.approx(
        float((rkl * m).sum() / m.sum()), rel=1e-6)
