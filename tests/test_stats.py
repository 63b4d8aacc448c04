"""Diagnostic statistics against brute-force and hand computations."""

import itertools
import math

import numpy as np
import pytest

from pwopsd.diagnostic.phases import label_candidate
from pwopsd.diagnostic.statistics import (
    DIVERSITY,
    GRAY,
    REAL_UNCERTAIN,
    auprc,
    auroc,
    cluster_bootstrap_ci,
    log_kappa,
    mc_dropout_scores,
    residualize,
    residualized_auroc,
)


def brute_auroc(scores, labels):
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    return sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg)) / (len(pos) * len(neg))


@pytest.mark.parametrize("seed", range(5))
def test_auroc_equals_pairwise_count_with_ties(seed):
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, 6, size=40).astype(float)  # many ties
    labels = rng.random(40) < 0.3
    assert auroc(scores, labels) == pytest.approx(brute_auroc(scores, labels), abs=1e-12)


def test_auroc_edge_cases():
    assert auroc([1, 2, 3], [0, 0, 0]) != auroc([1, 2, 3], [0, 0, 0])  # NaN without positives
    assert auroc([3, 1], [1, 0]) == 1.0 and auroc([1, 3], [1, 0]) == 0.0 and auroc([2, 2], [1, 0]) == 0.5


def test_auprc_hand_computed():
    # sorted: 0.9(+) 0.8(-) 0.7(+) 0.1(-): AP = 1/2*1 + 1/2*(2/3)
    assert auprc([0.9, 0.8, 0.7, 0.1], [1, 0, 1, 0]) == pytest.approx(0.5 + 1 / 3)
    # a tie of one positive and one negative at the top: precision 1/2 at recall 1
    assert auprc([0.5, 0.5], [1, 0]) == pytest.approx(0.5)


def test_residualization_centres_each_problem():
    scores = np.array([1.0, 2.0, 3.0, 10.0, 20.0])
    groups = ["a", "a", "a", "b", "b"]
    r = residualize(scores, groups)
    assert r.tolist() == [-1.0, 0.0, 1.0, -5.0, 5.0]
    labels = [0, 0, 1, 0, 1]
    # adding a constant per problem changes the raw AUROC but not the residualized one
    shifted = scores + np.array([100, 100, 100, 0, 0])
    assert residualized_auroc(shifted, labels, groups) == residualized_auroc(scores, labels, groups)
    assert auroc(shifted, labels) != auroc(scores, labels)


def test_equal_residuals_of_two_problems_tie():
    """Positions 0.1, 0.3 and 0.5, 0.7 centre to -0.1, +0.1 in both problems, exactly; computed in
    floating point they part in the last bit, and a pair of them must still count as a tie (0.5)."""
    r_tilde = np.array([0.1, 0.3, 0.5, 0.7])
    labels, groups = [1, 0, 0, 1], [0, 0, 1, 1]
    exact = [-0.1, 0.1, -0.1, 0.1]  # the centred 1 - r_tilde, as exact decimals
    assert residualized_auroc(1 - r_tilde, labels, groups) == brute_auroc([-x for x in exact], labels) == 0.5
    rng = np.random.default_rng(0)  # positions on a grid, problems of other offsets: many exact ties
    for _ in range(20):
        groups = np.repeat(np.arange(6), 4)
        r = (rng.integers(0, 8, size=24) + 0.5) / 8 + np.repeat(rng.integers(0, 3, size=6) / 10, 4)
        labels = rng.random(24) < 0.4
        centred = [round(x - r[groups == g].mean(), 9) for x, g in zip(r, groups)]
        assert residualized_auroc(r, labels, groups) == pytest.approx(brute_auroc(centred, labels), abs=1e-12)


def _synthetic(n_problems=60, per=6, effect=1.0, seed=1):
    rng = np.random.default_rng(seed)
    scores, labels, groups = [], [], []
    for p in range(n_problems):
        offset = rng.normal(0, 3)  # problem-level nuisance that residualization removes
        for _ in range(per):
            y = rng.random() < 0.3
            scores.append(offset + rng.normal(effect if y else 0.0, 1.0))
            labels.append(int(y))
            groups.append(p)
    return np.array(scores), np.array(labels), np.array(groups)


def test_bootstrap_interval_covers_a_known_effect():
    # True AUROC of N(1,1) vs N(0,1) is Phi(1/sqrt(2)) = 0.760.
    truth = 0.5 * (1 + math.erf(1 / 2))
    s, y, g = _synthetic()
    lo, hi = cluster_bootstrap_ci(s, y, g, n_boot=400, seed=0)
    assert lo < truth < hi and hi - lo < 0.25
    assert lo < residualized_auroc(s, y, g) < hi
    assert cluster_bootstrap_ci(s, y, g, n_boot=400, seed=0) == (lo, hi)  # seeded


def test_folded_orientation_reproduces_the_papers_lower_bounds_of_one_half():
    """A score with no effect: its raw interval straddles 0.5 and reaches below it; folding every
    draw (max(A, 1 - A)), the convention the paper's Table 1 implies, puts the lower bound at
    (about) 0.50 and moves the whole interval up: folding is biased upward."""
    from pwopsd.diagnostic.statistics import cluster_bootstrap_draws, fold, percentile_interval

    s, y, g = _synthetic(n_problems=40, effect=0.0, seed=3)
    raw = cluster_bootstrap_ci(s, y, g, n_boot=400, seed=0)
    folded = cluster_bootstrap_ci(s, y, g, n_boot=400, seed=0, orientation="folded")
    draws = cluster_bootstrap_draws(s, y, g, n_boot=400, seed=0)
    assert raw == percentile_interval(draws) and raw[0] < 0.5 < raw[1]
    # independent computation: fold each draw by hand, then the 2.5/97.5 percentiles
    by_hand = [d if d >= 0.5 else 1 - d for d in draws]
    assert folded == pytest.approx(tuple(np.quantile(by_hand, [0.025, 0.975])))
    assert 0.5 <= folded[0] < 0.52 and folded[1] >= raw[1]
    assert fold(0.3) == pytest.approx(0.7) and fold(0.8) == 0.8 and math.isnan(fold(float("nan")))
    with pytest.raises(ValueError, match="orientation"):
        cluster_bootstrap_ci(s, y, g, n_boot=10, orientation="oriented")


def test_bootstrap_resamples_whole_problems():
    # One problem only: every resample draws that same problem, so the interval collapses to the
    # point estimate (a candidate-level bootstrap would vary).
    s, y, _ = _synthetic(n_problems=1, per=30)
    g = np.zeros(len(s))
    lo, hi = cluster_bootstrap_ci(s, y, g, n_boot=50)
    assert lo == hi == pytest.approx(residualized_auroc(s, y, g))


@pytest.mark.parametrize(
    "viabilities,label",
    [
        ([0.75, 0.75, 0.0], DIVERSITY),  # exactly V_high counts as high
        ([0.74, 0.75, 0.0], GRAY),  # only one child at V_high
        ([1.0, 1.0, 1.0], DIVERSITY),
        ([0.39, 0.39, 0.39], REAL_UNCERTAIN),
        ([0.40, 0.0, 0.0], GRAY),  # V_low is strict: a child at 0.40 is not below it
        ([0.39, 0.39, 0.0], REAL_UNCERTAIN),
        ([1.0, 0.0, 0.0], GRAY),  # one viable child, mean 0.33: neither label
        ([], GRAY),
    ],
)
def test_labels_at_the_thresholds(viabilities, label):
    assert label_candidate(viabilities) == label


def test_mc_dropout_scores_hand_computed():
    p = np.array([[0.5, 0.5, 0.0], [0.7, 0.3, 0.0], [0.6, 0.4, 0.0]])
    s = mc_dropout_scores(p)
    p_bar = np.array([0.6, 0.4, 0.0])
    h = lambda q: -sum(x * math.log(x) for x in q if x > 0)  # noqa: E731
    assert s["h_full"] == pytest.approx(h(p_bar))
    assert s["mi"] == pytest.approx(h(p_bar) - np.mean([h(r) for r in p]))
    trace = (0.01 + 0.01 + 0 + 0 + 0 + 0) / 2 * 2  # per-class unbiased variances 0.01 and 0.01
    assert s["kappa"] == pytest.approx((1 - (0.36 + 0.16)) / trace - 1)  # 0.48 / 0.02 - 1 = 23
    assert s["kappa"] == pytest.approx(23.0)
    # Identical samples: zero variance, infinite precision, zero MI.
    same = mc_dropout_scores(np.array([[0.2, 0.8], [0.2, 0.8]]))
    assert same["kappa"] == float("inf") and same["mi"] == pytest.approx(0.0)
    # Small M can give a negative raw estimate; the log is floored only at score time.
    wild = mc_dropout_scores(np.array([[1.0, 0.0], [0.0, 1.0]]))
    assert wild["kappa"] < 0 and log_kappa(wild["kappa"]) == pytest.approx(math.log(1e-6))
