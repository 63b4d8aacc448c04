"""Paired significance of a method against a baseline (pwopsd.report.significance), each piece
against an independent computation: brute-force enumeration, a hand-computed Holm adjustment, the
bootstrap's variance against its closed form, and the interval's coverage on simulated benchmarks
with a known difference."""

import itertools

import numpy as np
import pytest

from pwopsd.report.significance import (bootstrap_deltas, compare, holm, paired_delta, problem_differences,
                                        sign_flip_p_value)


def brute_force_p(d):
    d = np.asarray(d, dtype=float)
    observed = abs(d.sum())
    hits = [abs(np.dot(signs, d)) >= observed - 1e-12 for signs in itertools.product([-1, 1], repeat=len(d))]
    return float(np.mean(hits))


@pytest.mark.parametrize("d", [[0.5, 0.25, -1 / 12, 1 / 3, 0.0, 0.75, 0.5],  # a zero and a tie of magnitudes
                               [1, 1, 1, 1, 1, 1],  # every sign the same: p = 2 / 2^6
                               [0.1, -0.1, 0.2, -0.2],  # observed mean 0: p = 1
                               list(np.random.default_rng(4).normal(0.1, 0.3, 12))])
def test_exact_sign_flip_p_value_equals_brute_force_enumeration(d):
    assert sign_flip_p_value(d) == pytest.approx(brute_force_p(d), abs=1e-12)


def test_monte_carlo_p_value_approaches_the_exact_one():
    d = np.random.default_rng(5).normal(0.1, 0.3, 22)
    exact = sign_flip_p_value(d, max_exact=22)
    assert 0.02 < exact < 0.9
    assert sign_flip_p_value(d, max_exact=0, n_perm=200000, seed=1) == pytest.approx(exact, abs=0.005)
    assert sign_flip_p_value([0.0, 0.0]) == 1.0


def test_holm_equals_a_hand_computation():
    # sorted: 0.005 x 4 = 0.02; 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04 -> max(0.06, 0.04) = 0.06
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02])
    np.testing.assert_allclose(holm([0.9, 0.3]), [0.9, 0.6])  # order kept
    np.testing.assert_allclose(holm([0.6, 0.9]), [1.0, 1.0])  # 0.6 x 2 capped at 1; the larger p no smaller
    assert holm([0.2]).tolist() == [0.2]


def test_the_delta_is_the_difference_of_the_table_cells():
    rng = np.random.default_rng(0)
    m, b = rng.random((30, 2, 3)), rng.random((30, 1, 3))
    assert paired_delta(m, b) == pytest.approx(m.mean() - b.mean())
    with pytest.raises(ValueError, match="paired by problem"):
        problem_differences(m, b[:29])


def test_bootstrap_variance_matches_its_closed_form_for_problems_and_runs():
    """Additive problem and run effects, b = 0: a replicate's delta is the mean of resampled problem
    effects plus the mean of resampled run effects, drawn independently, so its variance is
    var(a) / P + var(c) / R (population variances)."""
    rng = np.random.default_rng(1)
    a, c = rng.normal(0, 0.2, 40), np.array([0.05, -0.03, 0.1])
    method = a[:, None, None] + c[None, :, None] + np.zeros((1, 1, 3))
    draws = bootstrap_deltas(method, np.zeros((40, 1, 3)), n_boot=40000, seed=2)
    expected = np.sqrt(a.var() / 40 + c.var() / 3)
    assert draws.std() == pytest.approx(expected, rel=0.03)
    assert draws.mean() == pytest.approx(a.mean() + c.mean(), abs=3 * expected / 200)
    one_run = bootstrap_deltas(method[:, :1], np.zeros((40, 1, 3)), n_boot=40000, seed=2)
    assert one_run.std() == pytest.approx(np.sqrt(a.var() / 40), rel=0.03)  # one run: no run variance


@pytest.mark.slow
def test_the_interval_covers_a_known_difference_93_to_97_percent_of_the_time():
    """2,000 simulated benchmarks of 100 problems drawn from a population with a known difference:
    one training run per method, 3 eval seeds of 12 samples each (the paper's design), difficulty
    p ~ U(0.1, 0.8), the method's accuracy p + d with a problem's own d ~ U(-0.1, 0.2), so the
    population delta is exactly 0.05 (no accuracy leaves [0, 1])."""
    rng = np.random.default_rng(11)
    covered = 0
    n_sets, delta = 2000, 0.05
    for i in range(n_sets):
        p, d = rng.uniform(0.1, 0.8, 100), rng.uniform(-0.1, 0.2, 100)
        base = rng.binomial(12, p[:, None, None], size=(100, 1, 3)) / 12
        meth = rng.binomial(12, (p + d)[:, None, None], size=(100, 1, 3)) / 12
        c = compare(meth, base, n_boot=2000, seed=i, scale=1.0, n_perm=100)
        covered += c.low <= delta <= c.high
    assert 0.93 <= covered / n_sets <= 0.97, covered / n_sets


def test_compare_reports_points_and_the_design():
    rng = np.random.default_rng(3)
    p = rng.uniform(0.1, 0.7, 30)
    base = rng.binomial(12, p[:, None, None], size=(30, 2, 3)) / 12
    meth = rng.binomial(12, np.minimum(1, p + 0.2)[:, None, None], size=(30, 2, 3)) / 12
    c = compare(meth, base, n_boot=4000)
    assert c.delta == pytest.approx(100 * (meth.mean() - base.mean()))
    assert c.low < c.delta < c.high and c.excludes_zero() and c.p_value < 0.001
    assert (c.problems, c.method_runs, c.baseline_runs, c.eval_seeds) == (30, 2, 2, 3)
    same = compare(base, base, n_boot=500)
    assert same.delta == 0 and same.p_value == 1.0 and same.contains(0.0)


def _summary(checkpoint, benchmark, seed, values, metric="avg"):
    return {"model": "m", "checkpoint": checkpoint, "benchmark": benchmark, "seed_name": seed,
            "problems": [{"problem_id": pid, metric: v} for pid, v in values.items()]}


def test_problem_scores_align_problems_by_id_and_seeds_by_name():
    from pwopsd.report.significance import problem_scores

    summaries = [_summary("a", "b1", "2", {"p2": 0.5, "p1": 0.25}), _summary("a", "b1", "1", {"p1": 1.0, "p2": 0.0}),
                 _summary("a", "b2", "1", {"p9": 1.0})]
    np.testing.assert_array_equal(problem_scores(summaries, "m", "a", "b1", "avg")[:, 0, :], [[1.0, 0.25], [0.0, 0.5]])
    summaries.append(_summary("a", "b1", "3", {"p1": 1.0}))
    with pytest.raises(ValueError, match="seed 3 holds other problems"):
        problem_scores(summaries, "m", "a", "b1", "avg")
    with pytest.raises(ValueError, match="no metrics for m/c/b1"):
        problem_scores(summaries, "m", "c", "b1", "avg")


def test_the_mean_column_is_the_mean_of_the_benchmark_deltas_and_holm_runs_per_metric():
    from pwopsd.report.significance import significance_frame

    rng = np.random.default_rng(7)
    summaries = []
    for ckpt, shift in (("base", 0.0), ("x", 0.1), ("y", 0.0)):
        for bench, n in (("b1", 30), ("b2", 12)):
            for seed in ("1", "2"):
                values = {f"q{i}": float(np.clip(rng.normal(0.4 + shift, 0.2), 0, 1)) for i in range(n)}
                summary = _summary(ckpt, bench, seed, values)
                for p in summary["problems"]:
                    p["pass"] = float(p["avg"] > 0)
                summaries.append(summary)
    frame = significance_frame(summaries, [("m", "x", "base"), ("m", "y", "base")], ["b1", "b2"], ["avg", "pass"], n_boot=500)
    assert len(frame) == 12
    for method in ("x", "y"):
        rows = frame[(frame["method"] == method) & (frame["metric"] == "avg")].set_index("benchmark")
        assert rows.loc["mean", "delta"] == pytest.approx((rows.loc["b1", "delta"] + rows.loc["b2", "delta"]) / 2)
        assert rows.loc["mean", "problems"] == 42
    for metric in ("avg", "pass"):  # one family per metric
        rows = frame[frame["metric"] == metric]
        np.testing.assert_allclose(rows["p_holm"], holm(rows["p"]))
