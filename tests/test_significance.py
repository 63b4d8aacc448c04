"""Paired significance of a method against a baseline (pwopsd.report.significance), each piece
against an independent computation: Student's t against numerical integration of its density and
published quantiles, the mixed model's variance against hand computations and against the spread of
its delta over simulated benchmarks, Holm against a hand computation, and the calibration of the
interval and p (the table of issue 34, rebuilt)."""

import math

import numpy as np
import pytest

from pwopsd.report.power import simulate_decisions, simulated_scores
from pwopsd.report.significance import (compare, compare_strata, holm, mixed_model_fit, paired_delta, problem_differences,
                                        t_quantile, t_two_sided_p)


def t_tail_by_integration(t, df):
    """P(|T| >= t) by the trapezoid rule on Student's density (tail beyond 1e4 neglected)."""
    x = np.concatenate([np.linspace(t, t + 50, 200001), np.geomspace(t + 50, 1e4, 20001)[1:]])
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    density = np.exp(log_c - (df + 1) / 2 * np.log1p(x * x / df))
    return 2 * float(np.sum((density[1:] + density[:-1]) / 2 * np.diff(x)))


@pytest.mark.parametrize("t, df", [(0.5, 3.0), (2.0, 4.0), (2.7, 7.3), (1.3, 39.0), (4.0, 1.5)])
def test_t_tail_equals_numerical_integration_of_the_density(t, df):
    assert t_two_sided_p(t, df) == pytest.approx(t_tail_by_integration(t, df), rel=1e-4)


def test_t_quantiles_equal_the_published_table():
    # Student's t table (two-sided 5%): df 1, 2, 4, 10, 30, and the normal's 1.95996 for df -> inf
    for df, value in ((1, 12.7062), (2, 4.3027), (4, 2.7764), (10, 2.2281), (30, 2.0423), (1e9, 1.95996)):
        assert t_quantile(0.975, df) == pytest.approx(value, abs=1e-4)
    for df in np.concatenate([np.geomspace(0.05, 1e5, 120), np.arange(1.0, 60.0)]):  # every df a fit can give
        for q in (0.95, 0.975, 0.995, 0.9995):
            assert t_two_sided_p(t_quantile(q, df), df) == pytest.approx(2 * (1 - q), rel=1e-8), (q, df)
    assert t_two_sided_p(0.0, 3) == 1.0 and t_two_sided_p(math.inf, 3) == 0.0


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


def test_one_run_per_method_is_the_paired_t_test_over_problems():
    rng = np.random.default_rng(1)
    m, b = rng.random((25, 1, 3)), rng.random((25, 1, 3))
    d = m.mean(axis=(1, 2)) - b.mean(axis=(1, 2))
    se, t = d.std(ddof=1) / 5, d.mean() / (d.std(ddof=1) / 5)
    c = compare(m, b, scale=1.0)
    assert (c.df, c.run_variance_included) == (24, False)
    assert c.p_value == pytest.approx(t_two_sided_p(t, 24), rel=1e-12)
    assert c.high - c.delta == pytest.approx(t_quantile(0.975, 24) * se, rel=1e-9)


def test_the_run_variance_is_the_anova_estimate_of_the_balanced_design():
    """Two methods x 3 runs x 20 problems: sigma_run^2 from the two-way (run x problem) ANOVA of each
    method, (MS_run - MS_residual) / problems, pooled; Var(delta) = var(d) / P + sigma_run^2 (2 / 3)."""
    rng = np.random.default_rng(2)
    problems, runs = 20, 3
    m = rng.normal(0, 1, (problems, 1, 1)) + rng.normal(0, 0.5, (1, runs, 1)) + rng.normal(0, 0.3, (problems, runs, 2))
    b = rng.normal(0, 1, (problems, 1, 1)) + rng.normal(0, 0.5, (1, runs, 1)) + rng.normal(0, 0.3, (problems, runs, 2))
    estimates = []
    for x in (m, b):
        y = x.mean(axis=2)  # [problems, runs]
        resid = y - y.mean(axis=0) - y.mean(axis=1, keepdims=True) + y.mean()
        ms_run = problems * ((y.mean(axis=0) - y.mean()) ** 2).sum() / (runs - 1)
        ms_res = (resid ** 2).sum() / ((runs - 1) * (problems - 1))
        estimates.append((ms_run - ms_res) / problems)
    sigma2 = np.mean(estimates)
    d = m.mean(axis=(1, 2)) - b.mean(axis=(1, 2))
    fit = mixed_model_fit([(m, b)])
    assert sigma2 > 0 and fit.run_variance == pytest.approx(sigma2, rel=1e-9)
    assert fit.variance == pytest.approx(d.var(ddof=1) / problems + sigma2 * 2 / runs, rel=1e-9)
    assert runs - 1 <= fit.df <= problems - 1 + 2 * (runs - 1)  # Satterthwaite: within its parts' total


def test_the_model_variance_matches_the_spread_of_delta_over_simulated_benchmarks():
    """Problem-specific effects, run levels and eval noise all present (two strata of different
    sizes, runs shared by the strata): the mean of the model's variance equals the variance of
    delta over 1,500 simulated benchmarks."""
    rng = np.random.default_rng(3)
    deltas, variances = [], []
    for _ in range(1500):
        runs_m, runs_b = rng.normal(0, 0.04, (1, 4, 1)), rng.normal(0, 0.04, (1, 3, 1))
        strata = []
        for problems in (30, 12):
            effect = rng.normal(0.02, 0.05, (problems, 1, 1))
            strata.append((effect + runs_m + rng.normal(0, 0.1, (problems, 4, 3)),
                           runs_b + rng.normal(0, 0.1, (problems, 3, 3))))
        fit = mixed_model_fit(strata)
        deltas.append(fit.delta)
        variances.append(fit.variance)
    assert np.mean(variances) == pytest.approx(np.var(deltas), rel=0.1)


def test_compare_reports_points_and_the_design():
    rng = np.random.default_rng(3)
    p = rng.uniform(0.1, 0.7, 30)
    base = rng.binomial(12, p[:, None, None], size=(30, 2, 3)) / 12
    meth = rng.binomial(12, np.minimum(1, p + 0.2)[:, None, None], size=(30, 2, 3)) / 12
    c = compare(meth, base)
    assert c.delta == pytest.approx(100 * (meth.mean() - base.mean()))
    assert c.low < c.delta < c.high and c.excludes_zero() and c.p_value < 0.01
    assert (c.problems, c.method_runs, c.baseline_runs, c.eval_seeds, c.run_variance_included) == (30, 2, 2, 3, True)
    same = compare(base, base)
    assert same.delta == 0 and same.p_value == 1.0 and same.contains(0.0)
    with pytest.raises(ValueError, match="same training runs"):
        compare_strata([(meth, base), (meth[:, :1], base)])


def test_the_interval_excludes_zero_exactly_when_p_is_below_alpha():
    rng = np.random.default_rng(4)
    for i in range(200):
        m, b = simulated_scores(rng, {"problem": 0.001, "run": 0.0004, "eval": 0.01}, delta=0.01 * (i % 4),
                                runs=1 + i % 3, eval_seeds=2, problems=20)
        c = compare(m, b)
        assert c.excludes_zero() == (c.p_value < 0.05)


# The calibration of issue 34: 40 problems, 2 eval seeds, per-(problem, run) noise 5 points (each
# eval seed's noise sd 5 x sqrt(2)), true delta 0; training-run sd 0, 2 or 4 points; 1-10 runs.
CALIBRATION_TRIALS = 400


def calibration_cell(run_sd: float, runs: int, delta: float = 0.0, trials: int = CALIBRATION_TRIALS) -> dict:
    components = {"problem": 0.0, "run": (run_sd / 100) ** 2, "eval": 2 * 0.05 ** 2}
    return simulate_decisions(components, delta=delta / 100, runs=runs, eval_seeds=2, problems=40, n_sim=trials,
                              seed=100 * runs + int(10 * run_sd))


@pytest.mark.parametrize("run_sd", [0.0, 2.0, 4.0])
def test_interval_covers_and_p_keeps_its_level_from_3_runs_per_method(run_sd):
    """Every cell with >= 3 runs per method: coverage 0.95 and false positives 0.05, each within 3
    Monte Carlo standard errors of 400 trials (0.033). One run per method is reported, not held to
    it: without training-seed variance its false positives grow with the run sd."""
    tolerance = 3 * math.sqrt(0.95 * 0.05 / CALIBRATION_TRIALS)
    row = {}
    for runs in (1, 3, 5, 10):
        cell = calibration_cell(run_sd, runs)
        row[runs] = cell
        if runs >= 3:
            assert abs(cell["coverage"] - 0.95) <= tolerance, (runs, cell)
            assert cell["rejected"] <= 0.05 + tolerance, (runs, cell)
    if run_sd == 0:
        assert abs(row[1]["coverage"] - 0.95) <= tolerance
    else:
        assert row[1]["rejected"] > 0.05 + tolerance  # the caption's warning is needed
    power = {d: calibration_cell(run_sd, 3, delta=d, trials=200)["rejected"] for d in (2.0, 5.0)}
    print(f"run sd {run_sd:g}: coverage / p < 0.05 at 1, 3, 5, 10 runs: "
          + "; ".join(f"{r}: {c['coverage']:.3f} / {c['rejected']:.3f}" for r, c in row.items())
          + f"; power at 3 runs: 2 points {power[2.0]:.2f}, 5 points {power[5.0]:.2f}")
    assert power[5.0] >= power[2.0] >= row[3]["rejected"] - tolerance


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
    frame = significance_frame(summaries, [("m", "x", "base"), ("m", "y", "base")], ["b1", "b2"], ["avg", "pass"])
    assert len(frame) == 12
    for method in ("x", "y"):
        rows = frame[(frame["method"] == method) & (frame["metric"] == "avg")].set_index("benchmark")
        assert rows.loc["mean", "delta"] == pytest.approx((rows.loc["b1", "delta"] + rows.loc["b2", "delta"]) / 2)
        assert rows.loc["mean", "problems"] == 42
    for metric in ("avg", "pass"):  # one family per metric
        rows = frame[frame["metric"] == metric]
        np.testing.assert_allclose(rows["p_holm"], holm(rows["p"]))


def test_gains_over_base_pair_each_run_with_the_base_model_on_the_mean_of_benchmarks():
    """Each run alone against the base: the delta is the mean over benchmarks of the per-benchmark
    paired deltas; with one benchmark it is the paired t-test over problems of the seed means. A run
    that gained (interval above 0) passes the learning check, one that did not is named."""
    from pwopsd.report.significance import gains_over_base, learning_problems

    rng = np.random.default_rng(3)
    summaries, means = [], {}
    for ckpt, shift in (("base", 0.0), ("good", 0.25), ("flat", 0.0)):
        for bench, n in (("b1", 30), ("b2", 12)):
            for seed in ("1", "2", "3"):
                values = {f"q{i}": float(np.clip(rng.normal(0.4 + shift, 0.1), 0, 1)) for i in range(n)}
                summaries.append(_summary(ckpt, bench, seed, values))
                means.setdefault((ckpt, bench), []).append([values[f"q{i}"] for i in range(n)])
    gains = gains_over_base(summaries, "m", ["good", "flat"], ["b1", "b2"])
    for run in ("good", "flat"):
        per_bench = [np.mean(np.mean(means[(run, b)], axis=0) - np.mean(means[("base", b)], axis=0)) for b in ("b1", "b2")]
        assert gains[run].delta == pytest.approx(100 * np.mean(per_bench), rel=1e-12)
        assert (gains[run].method_runs, gains[run].baseline_runs, gains[run].eval_seeds) == (1, 1, 3)
    d = np.mean(means[("good", "b1")], axis=0) - np.mean(means[("base", "b1")], axis=0)
    one = gains_over_base(summaries, "m", ["good"], ["b1"])["good"]
    assert one.high - one.delta == pytest.approx(100 * t_quantile(0.975, 29) * d.std(ddof=1) / math.sqrt(30), rel=1e-9)
    assert gains["good"].low > 0
    problems = learning_problems(gains)
    assert len(problems) == 1 and problems[0].startswith("flat: ") and "not above 0" in problems[0]


def test_checkpoints_holding_other_problems_are_not_paired_by_position():
    """Scores are paired in the order of sorted problem ids: a method and a baseline (or two runs
    of a method) holding other problems are refused, not paired row by row."""
    from pwopsd.report.significance import significance_frame

    def summary(checkpoint, scores):
        return {"model": "q", "checkpoint": checkpoint, "benchmark": "b", "seed_name": "main",
                "problems": [{"problem_id": k, "avg": v} for k, v in scores.items()]}

    same = [summary("m", {"1": 1.0, "2": 0.0, "3": 1.0}), summary("base", {"1": 0.0, "2": 0.0, "3": 1.0})]
    row = significance_frame(same, [("q", "m", "base")], ["b"], ["avg"]).iloc[0]
    assert row["delta"] == pytest.approx(100 / 3)
    other = [same[0], summary("base", {"1": 0.0, "2": 0.0, "4": 1.0})]
    with pytest.raises(ValueError, match=r"other problems.*\['3', '4'\]"):
        significance_frame(other, [("q", "m", "base")], ["b"], ["avg"])
    runs = [*same, summary("m2", {"1": 1.0, "2": 1.0, "5": 0.0})]
    with pytest.raises(ValueError, match="other problems"):
        significance_frame(runs, [("q", "m", "base")], ["b"], ["avg"], runs={"m": ["m", "m2"]})
