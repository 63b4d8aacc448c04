"""How many seeds are enough (pwopsd.report.power): variance components recovered from data
simulated with known ones, and simulated power that behaves as it must."""

import numpy as np
import pytest

from pwopsd.report.power import simulate_power, variance_components


def simulated(rng, problems, runs, seeds, sd_problem, sd_run, sd_eval, delta):
    effect = rng.normal(delta, sd_problem, problems)[:, None, None]
    method = effect + rng.normal(0, sd_run, (1, runs, 1)) + rng.normal(0, sd_eval, (problems, runs, seeds))
    baseline = rng.normal(0, sd_run, (1, runs, 1)) + rng.normal(0, sd_eval, (problems, runs, seeds))
    return method, baseline


def test_variance_components_recover_the_simulated_ones():
    rng = np.random.default_rng(0)
    est = {k: [] for k in ("problem", "eval", "run")}
    for _ in range(40):  # the run variance comes from few runs: average the estimates of many datasets
        m, b = simulated(rng, 400, 4, 6, sd_problem=0.1, sd_run=0.03, sd_eval=0.2, delta=0.02)
        c = variance_components(m, b)
        for k in est:
            est[k].append(c[k])
    assert np.mean(est["problem"]) == pytest.approx(0.01, rel=0.1)
    assert np.mean(est["eval"]) == pytest.approx(0.04, rel=0.02)
    assert np.mean(est["run"]) == pytest.approx(0.0009, rel=0.3)
    one_run = variance_components(m[:, :1], b[:, :1])
    assert one_run["run"] == 0 and not one_run["run_estimated"]
    with pytest.raises(ValueError, match="2 eval seeds"):
        variance_components(m[:, :, :1], b[:, :, :1])


def test_simulated_power_grows_with_seeds_and_the_false_positive_rate_is_near_alpha_without_run_variance():
    comp = {"problem": 0.01, "run": 0.0, "eval": 0.04}
    few = simulate_power(comp, delta=0.03, runs=1, eval_seeds=1, problems=60, n_sim=200)
    many = simulate_power(comp, delta=0.03, runs=1, eval_seeds=12, problems=60, n_sim=200)
    assert many > few + 0.2
    assert simulate_power(comp, delta=0.3, runs=1, eval_seeds=3, problems=60, n_sim=100) == 1.0
    assert simulate_power(comp, delta=0.0, runs=1, eval_seeds=3, problems=60, n_sim=400) < 0.1
    # training-run variance with one run per method: the interval cannot hold it, false positives rise
    noisy = {**comp, "run": 0.0025}
    assert simulate_power(noisy, delta=0.0, runs=1, eval_seeds=3, problems=60, n_sim=200) > 0.2
    assert simulate_power(noisy, delta=0.0, runs=4, eval_seeds=3, problems=60, n_sim=200) < \
        simulate_power(noisy, delta=0.0, runs=1, eval_seeds=3, problems=60, n_sim=200)
