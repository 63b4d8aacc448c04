"""Metrics: Maj@N clustering with the INVALID cluster (winning, losing, ties), the exact-string
Maj@N, Avg/Pass/format rate, Bessel std and the equal-weight benchmark mean across seeds."""

import statistics

import numpy as np
import pandas as pd
import pytest

from pwopsd.evaluation.metrics import INVALID, aggregate_seeds, maj_clusters, metrics_from_grades, problem_metrics, seed_mean_std

# A hand-written equivalence between answer strings (independent of math-verify): same value.
VALUE = {"1/2": 0.5, "0.5": 0.5, "\\frac12": 0.5, "3": 3, "3.0": 3, "7": 7, "8": 8}


def eq(ref, pred):
    return VALUE[ref] == VALUE[pred]


def m(preds, gold_value):
    correct = [p is not None and VALUE[p] == gold_value for p in preds]
    return metrics_from_grades(preds, correct, eq)


def test_invalid_wins_and_scores_zero():
    # 3 unformatted vs 2 equivalent correct answers: INVALID takes part in the vote and wins.
    r = m([None, "1/2", None, "0.5", None], 0.5)
    assert r == {"avg": 0.4, "pass": 1.0, "maj": 0.0, "maj_string": 1.0, "format_rate": 0.4}


def test_invalid_loses_to_an_equivalence_cluster():
    # Strings differ, values agree: the clustering merges them (3) and beats INVALID (2).
    r = m([None, "1/2", "0.5", None, "\\frac12", "3"], 0.5)
    assert r["maj"] == 1.0
    # The exact-string vote sees three singletons and the first one seen is "1/2": correct too.
    assert r["maj_string"] == 1.0


def test_ties_go_to_the_earliest_created_cluster():
    assert m(["3", "7", "3.0", "7"], 3)["maj"] == 1.0  # {3, 3.0} created first, 2 vs 2
    assert m(["7", "3", "3.0", "7"], 3)["maj"] == 0.0  # {7} created first
    # INVALID is created at its first member: a tie with INVALID created first goes to INVALID.
    assert m([None, "3", None, "3.0"], 3)["maj"] == 0.0
    assert m(["3", None, "3.0", None], 3)["maj"] == 1.0


def test_exact_string_vote_differs_from_clustering():
    preds = ["1/2", "0.5", "7", "7"]
    r = m(preds, 0.5)
    assert r["maj"] == 1.0 and r["maj_string"] == 0.0  # {1/2, 0.5} (2, first) vs "7" (2 strings)
    assert m([None, None], 3)["maj_string"] == 0.0  # nothing formatted


def test_cluster_labels_and_representative():
    preds = ["0.5", None, "7", "1/2", None, "8", None]
    labels, winner = maj_clusters([p is not None for p in preds], lambda i, j: eq(preds[j], preds[i]))
    assert labels == [0, INVALID, 2, 0, INVALID, 5, INVALID]
    assert winner == INVALID


def test_equivalence_checked_both_directions():
    # grade(pred, rep) false but grade(rep, pred) true still merges (the reference checks both).
    one_way = lambda ref, pred: (ref, pred) == ("b", "a")  # noqa: E731
    r = metrics_from_grades(["a", "b", "c"], [False, True, False], one_way)
    assert r["maj"] == 0.0  # {a, b} wins (2) and its representative "a" is wrong


def test_problem_metrics_with_real_grading():
    preds = ["\\frac{1}{2}", "0.5", None, "2/4", "3", None, None, None, "1/2", "0.50", "\\dfrac{1}{2}", "7"]
    r = problem_metrics(preds, "\\frac12")
    assert r["avg"] == pytest.approx(6 / 12) and r["pass"] == 1.0
    assert r["maj"] == 1.0  # 6 equivalent answers beat 4 INVALID
    assert r["format_rate"] == pytest.approx(8 / 12)
    assert r["maj_string"] == 1.0  # all singletons: the first seen, \frac{1}{2}, is correct


def test_seed_mean_and_bessel_std():
    vals = [70.2, 71.5, 69.9]
    mean, std = seed_mean_std(vals)
    assert mean == pytest.approx(statistics.mean(vals))
    assert std == pytest.approx(statistics.stdev(vals))  # n-1 denominator
    assert np.isnan(seed_mean_std([1.0])[1])


def test_benchmark_mean_from_unrounded_seed_values():
    rng = np.random.default_rng(0)
    benches, seeds = ["b1", "b2", "b3", "b4"], ["main", "1", "2"]
    values = {(b, s): float(rng.uniform(0, 100)) for b in benches for s in seeds}
    table = pd.DataFrame([{"model": "m", "checkpoint": "c", "benchmark": b, "seed": s, "metric": "avg", "value": v}
                          for (b, s), v in values.items()])
    agg = aggregate_seeds(table, benchmarks_for_mean=benches).set_index("benchmark")
    per_seed_means = [np.mean([values[(b, s)] for b in benches]) for s in sorted(seeds)]
    assert agg.loc["mean", "mean"] == pytest.approx(np.mean(per_seed_means))
    assert agg.loc["mean", "std"] == pytest.approx(np.std(per_seed_means, ddof=1))
    assert agg.loc["b2", "std"] == pytest.approx(np.std([values[("b2", s)] for s in seeds], ddof=1))
    # Not the mean of per-benchmark means of rounded values, and not their std.
    assert agg.loc["mean", "std"] != pytest.approx(np.mean([agg.loc[b, "std"] for b in benches]))


def test_benchmark_mean_skips_incomplete_seeds():
    table = pd.DataFrame([
        {"model": "m", "checkpoint": "c", "benchmark": b, "seed": s, "metric": "avg", "value": v}
        for b, s, v in [("b1", "1", 10), ("b2", "1", 20), ("b1", "2", 30)]
    ])
    agg = aggregate_seeds(table, benchmarks_for_mean=["b1", "b2"]).set_index("benchmark")
    assert agg.loc["mean", "n_seeds"] == 1 and agg.loc["mean", "mean"] == 15
