"""The PW-OPSD schedule w(r) and its fit to the diagnostic's forced-continuation outcomes: the fit
recovers known parameters from data simulated from a known schedule (within its cluster-bootstrap
interval), and pools that cannot identify a schedule raise a clear error."""

import math

import numpy as np
import pytest

from pwopsd.schedule import ScheduleFitError, fit_mle, fit_schedule, log_likelihood, nelder_mead, schedule_weight

pytestmark = pytest.mark.vllm_stack  # torch-free: also runs under the analysis/vLLM stacks


def test_schedule_weight_numpy_equals_torch_and_the_formula():
    torch = pytest.importorskip("torch")
    r = np.linspace(0, 1, 11)
    ours = schedule_weight(r, w_min=0.25, tau=0.3, s=0.1)
    by_hand = [0.25 + 0.75 / (1 + math.exp(-(x - 0.3) / 0.1)) for x in r]
    np.testing.assert_allclose(ours, by_hand, rtol=1e-12)
    t = schedule_weight(torch.tensor(r, dtype=torch.float64), w_min=0.25, tau=0.3, s=0.1)
    np.testing.assert_allclose(t.numpy(), by_hand, rtol=1e-12)


def test_nelder_mead_finds_a_quadratic_minimum():
    x = nelder_mead(lambda v: float(((v - np.array([1.0, -2.0, 0.5])) ** 2).sum()), np.zeros(3), iters=2000, tol=1e-14)
    np.testing.assert_allclose(x, [1.0, -2.0, 0.5], atol=1e-4)


def simulate(w_min, tau, s, v_max, *, problems=60, per=5, children=3, rollouts=6, seed=0):
    rng = np.random.default_rng(seed)
    r, k, n, g = [], [], [], []
    for p in range(problems):
        for _ in range(per):
            x = rng.uniform(0, 1)
            trials = children * rollouts
            k.append(rng.binomial(trials, v_max * float(schedule_weight(x, w_min=w_min, tau=tau, s=s))))
            r.append(x), n.append(trials), g.append(f"p{p}")
    return np.array(r), np.array(k), np.array(n), np.array(g)


def test_fit_recovers_a_known_schedule_within_its_interval():
    truth = {"w_min": 0.25, "tau": 0.3, "s": 0.1}
    r, k, n, g = simulate(**truth, v_max=0.9)
    fit = fit_schedule(r, k, n, g, n_boot=60, seed=0, level=0.95, min_candidates=20)
    for p, value in truth.items():
        lo, hi = fit["ci"][p]
        assert lo <= value <= hi, (p, value, fit["ci"][p], fit["params"])
        assert abs(fit["params"][p] - value) < 0.1, (p, fit["params"])
    assert fit["pool"] == {"candidates": 300, "problems": 60, "continuations": 5400, "recovered": int(k.sum())}
    curve = fit["curve"]
    assert len(curve["r"]) == 101 and all(lo <= w + 1e-9 and w <= hi + 1e-9 for lo, w, hi in zip(curve["low"], curve["w"], curve["high"]))
    # the maximum is a maximum: nudging any parameter lowers the likelihood
    best = log_likelihood(r, k, n, v_max=fit["v_max"], **fit["params"])
    for p in truth:
        for d in (-0.02, 0.02):
            moved = {**fit["params"], p: fit["params"][p] + d}
            assert log_likelihood(r, k, n, v_max=fit["v_max"], **moved) <= best + 1e-9


def test_flat_reliability_fits_a_high_floor():
    """No position effect in the data: the fitted weight is nearly flat (its floor near 1 or its
    step outside the observed range), not an invented schedule."""
    r, k, n, g = simulate(w_min=1.0, tau=0.5, s=0.1, v_max=0.6, seed=2)
    fit = fit_mle(r, k, n)
    w = schedule_weight(np.linspace(0.05, 0.95, 10), **{p: fit[p] for p in ("w_min", "tau", "s")})
    assert float(w.max() - w.min()) < 0.15


@pytest.mark.parametrize("k,groups,words", [
    ([0] * 30, [f"p{i % 5}" for i in range(30)], "every one of the 540 forced continuations failed"),
    ([18] * 30, [f"p{i % 5}" for i in range(30)], "recovered the answer"),
    ([3] * 30, ["p0"] * 30, "at least 2"),
])
def test_pools_that_identify_nothing_are_refused(k, groups, words):
    r = np.linspace(0, 1, 30)
    with pytest.raises(ScheduleFitError, match=words):
        fit_schedule(r, k, [18] * 30, groups, n_boot=5, seed=0, level=0.95, min_candidates=20)
    with pytest.raises(ScheduleFitError, match="min_candidates=40"):
        fit_schedule(r, [3] * 30, [18] * 30, [f"p{i % 5}" for i in range(30)], n_boot=5, seed=0, level=0.95, min_candidates=40)
