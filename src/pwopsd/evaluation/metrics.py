"""Per-problem and aggregate metrics of the paper's appendix ("Evaluation metric definitions").

For one problem with N extracted predictions (``None`` = unformatted) and their correctness:

* ``avg``  = mean correctness (Avg@N);
* ``pass`` = 1 if any sample is correct (Pass@N);
* ``maj``  = Maj@N with greedy math-equivalence clustering in sample order: an unformatted sample
  joins the single INVALID cluster (created at the first unformatted sample); a formatted one joins
  the first existing cluster whose representative (its first member) is equivalent in either
  direction, else opens a new cluster. The largest cluster wins, ties going to the earliest
  created; INVALID takes part in the vote and scores 0 when it wins; otherwise the winner scores
  the correctness of its representative;
* ``maj_string`` = the original OPSD Maj@N: exact-string plurality over formatted samples only,
  ties to the first seen, 0 when no sample is formatted;
* ``format_rate`` = share of formatted samples.

The clustering takes an equivalence oracle ``equiv(i, j)`` so that the same code serves a single
problem (:func:`problem_metrics`, grading on the fly) and whole benchmarks (grading every needed
pair in one parallel batch first, :func:`clustering_pairs`).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

INVALID = -1


def maj_clusters(formatted: Sequence[bool], equiv: Callable[[int, int], bool]) -> tuple[list[int], int]:
    """Cluster id per sample (``INVALID`` for unformatted ones) and the winning cluster id.

    Cluster ids are the index of each cluster's representative (first member), so creation order
    is the order of ids... except INVALID, whose creation position is its first member's index.
    """
    reps: list[int] = []  # representatives of the non-INVALID clusters, in creation order
    labels: list[int] = []
    for i, ok in enumerate(formatted):
        if not ok:
            labels.append(INVALID)
            continue
        for r in reps:
            if equiv(i, r) or equiv(r, i):
                labels.append(r)
                break
        else:
            reps.append(i)
            labels.append(i)
    counts: dict[int, int] = {}
    created: dict[int, int] = {}
    for i, lab in enumerate(labels):
        counts[lab] = counts.get(lab, 0) + 1
        created.setdefault(lab, i)
    winner = min(counts, key=lambda lab: (-counts[lab], created[lab])) if counts else INVALID
    return labels, winner


def maj_at_n(formatted: Sequence[bool], correct: Sequence[bool], equiv: Callable[[int, int], bool]) -> int:
    labels, winner = maj_clusters(formatted, equiv)
    return 0 if winner == INVALID else int(bool(correct[winner]))


def maj_string_at_n(predictions: Sequence[str | None], correct: Sequence[bool]) -> int:
    first: dict[str, int] = {}
    counts: dict[str, int] = {}
    for i, p in enumerate(predictions):
        if p is None:
            continue
        counts[p] = counts.get(p, 0) + 1
        first.setdefault(p, i)
    if not counts:
        return 0
    winner = min(counts, key=lambda s: (-counts[s], first[s]))
    return int(bool(correct[first[winner]]))


def clustering_pairs(predictions: Sequence[str | None]) -> list[tuple[str, str]]:
    """Every ordered pair (self-pairs included) of distinct formatted predictions the clustering
    may compare. Identical strings are graded too: under the reference grader two identical
    unparseable answers are *not* equivalent (``verify([], [])`` is False)."""
    distinct = list(dict.fromkeys(p for p in predictions if p is not None))
    return [(a, b) for a in distinct for b in distinct]


def metrics_from_grades(predictions: Sequence[str | None], correct: Sequence[bool],
                        equivalent: Callable[[str, str], bool], undecided: set[str] | frozenset = frozenset()) -> dict:
    """Metrics of one problem given per-sample correctness and an equivalence of two predictions
    (``equivalent(a, b)``: is ``b`` equivalent to ``a`` taken as the reference). Predictions in
    ``undecided`` (their clustering comparisons ran out of time) join the INVALID cluster for
    Maj@N; every other metric is unaffected."""
    n = len(predictions)
    if n == 0:
        raise ValueError("a problem needs at least one prediction")
    formatted = [p is not None for p in predictions]
    clustered = [p is not None and p not in undecided for p in predictions]

    def equiv(i: int, j: int) -> bool:
        # The reference's grade_answer(pred_i, pred_j): pred_j is the reference (gold) side.
        return equivalent(predictions[j], predictions[i])

    return {
        "avg": float(np.mean(correct)),
        "pass": float(any(correct)),
        "maj": float(maj_at_n(clustered, correct, equiv)),
        "maj_string": float(maj_string_at_n(predictions, correct)),
        "format_rate": float(np.mean(formatted)),
    }


def problem_metrics(predictions: Sequence[str | None], gold: str, *, pool=None, timeout: float = 5.0, options=None) -> dict:
    """Avg/Pass/Maj/Maj-string/format rate of one problem's N extracted predictions.

    Grades with a :class:`pwopsd.evaluation.grading.GraderPool` (one is started if none is given).
    """
    from pwopsd.evaluation.grading import GraderPool, GradingOptions

    own = pool is None
    pool = pool or GraderPool(timeout=timeout, options=options or GradingOptions())
    try:
        grades = pool.grade_pairs([(gold, p) for p in predictions])
        pairs = clustering_pairs(predictions)
        eq = pool.grade_pairs([(ref, pred, False) for ref, pred in pairs])
        table = {pair: g.correct for pair, g in zip(pairs, eq)}
        return metrics_from_grades(predictions, [g.correct for g in grades], lambda ref, pred: table.get((ref, pred), False))
    finally:
        if own:
            pool.close()


# ----------------------------------------------------------------------------------------------
# Aggregation across problems, seeds and benchmarks.

METRICS = ("avg", "pass", "maj", "maj_string", "format_rate")


def seed_mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and Bessel-corrected sample standard deviation (NaN std for a single seed)."""
    v = np.asarray(values, dtype=float)
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else float("nan")


def aggregate_seeds(seed_table, *, benchmarks_for_mean: Sequence[str] | None = None, mean_name: str = "mean"):
    """Aggregate benchmark-level metrics over seeds.

    ``seed_table``: tidy rows ``model, checkpoint, benchmark, seed, metric, value`` (percent).
    Returns rows ``model, checkpoint, benchmark, metric, mean, std, n_seeds, values`` and, per
    (model, checkpoint, metric), an equal-weight ``benchmark = mean_name`` row computed from the
    unrounded seed-level values (benchmark mean per seed first, then mean/std over seeds). The
    cross-benchmark row is only formed for seeds where every benchmark is present.
    """
    import pandas as pd

    rows = []
    keys = ["model", "checkpoint", "benchmark", "metric"]
    for key, grp in seed_table.groupby(keys, sort=False):
        grp = grp.sort_values("seed")
        m, s = seed_mean_std(grp["value"])
        rows.append({**dict(zip(keys, key)), "mean": m, "std": s, "n_seeds": len(grp),
                     "seeds": list(map(str, grp["seed"])), "values": list(map(float, grp["value"]))})
    table = seed_table
    if benchmarks_for_mean is not None:
        table = table[table["benchmark"].isin(benchmarks_for_mean)]
    want = set(benchmarks_for_mean) if benchmarks_for_mean is not None else None
    for (model, ckpt, metric), grp in table.groupby(["model", "checkpoint", "metric"], sort=False):
        per_seed = []
        seeds = []
        bench_set = want or set(grp["benchmark"])
        for seed, sg in grp.groupby("seed", sort=True):
            if set(sg["benchmark"]) >= bench_set:
                per_seed.append(float(sg[sg["benchmark"].isin(bench_set)]["value"].mean()))
                seeds.append(str(seed))
        if per_seed:
            m, s = seed_mean_std(per_seed)
            rows.append({"model": model, "checkpoint": ckpt, "benchmark": mean_name, "metric": metric, "mean": m,
                         "std": s, "n_seeds": len(per_seed), "seeds": seeds, "values": per_seed})
    return pd.DataFrame(rows)
