"""Is a method's gain real? Paired comparison of two methods over problems, training runs and eval seeds.

The data of one comparison (one model, benchmark and metric) are two arrays of per-problem scores,
``method[p, r, e]`` and ``baseline[p, r, e]``: problem ``p`` (the same problems, in the same order,
for both), training run ``r`` (one per training seed; the two methods' runs are not paired), eval
seed ``e`` (the metric of that problem's samples under that seed: Avg@12 as a fraction, Maj@12 and
Pass@12 as 0/1). The difference of the two methods is the mean over problems of their per-problem
means over runs and seeds (:func:`paired_delta`), i.e. exactly the difference of the two table
cells.

Interval (:func:`bootstrap_deltas`, a hierarchical bootstrap). What is resampled and why:

- **problems**, with replacement, as clusters: a resampled problem brings all of its runs and seeds
  with it, in both methods (the pairing);
- **training runs**, with replacement, per method, once per replicate and shared by every problem:
  a run is crossed with the problems (a good run is good on all of them), so resampling it inside
  each problem would average its effect away; with one run per method (the paper) there is nothing
  to resample and the interval does not include training-seed variance (it cannot be estimated from
  one run);
- **eval seeds are not resampled**: they are nested in (problem, run), so their sampling noise is
  already in the per-problem differences the problem bootstrap resamples; resampling them again
  would count that noise twice (Ren et al. 2010, "Nonparametric bootstrapping for hierarchical
  data", resample the top level only).

Test (:func:`sign_flip_p_value`): a paired sign-flip permutation test over problems: under "no
difference" the sign of each problem's difference is as likely either way, so the p-value is the
share of sign assignments whose mean difference is at least as far from 0 as the observed one;
exact enumeration over the problems whose difference is not zero when there are at most
``max_exact`` of them, Monte Carlo otherwise. Several comparisons of one table: Holm's step-down
correction (:func:`holm`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from pwopsd.diagnostic.statistics import percentile_interval


def _scores(a) -> np.ndarray:
    x = np.asarray(a, dtype=float)
    if x.ndim == 1:
        x = x[:, None, None]
    if x.ndim != 3 or np.isnan(x).any() or x.size == 0:
        raise ValueError("scores must be a complete [problems, training runs, eval seeds] array")
    return x


def problem_differences(method, baseline) -> np.ndarray:
    """Per problem: the method's mean over its runs and seeds minus the baseline's."""
    m, b = _scores(method), _scores(baseline)
    if m.shape[0] != b.shape[0]:
        raise ValueError(f"paired by problem: {m.shape[0]} problems against {b.shape[0]}")
    return m.mean(axis=(1, 2)) - b.mean(axis=(1, 2))


def paired_delta(method, baseline) -> float:
    """Method minus baseline: the difference of the two table cells (means over problems, runs, seeds)."""
    return float(problem_differences(method, baseline).mean())


def bootstrap_deltas(method, baseline, *, n_boot: int = 10000, seed: int = 0) -> np.ndarray:
    """Bootstrap replicates of :func:`paired_delta`: problems resampled as clusters, training runs
    resampled per method and shared by all problems, eval seeds kept (see the module docstring)."""
    return stratified_bootstrap_deltas([(method, baseline)], n_boot=n_boot, seed=seed)


def stratified_bootstrap_deltas(strata: Sequence[tuple], *, n_boot: int = 10000, seed: int = 0) -> np.ndarray:
    """Bootstrap replicates of the mean over strata (benchmarks: a table's mean column) of each
    stratum's :func:`paired_delta`. Problems are resampled within their stratum; a replicate's
    training runs are drawn once per method and shared by every stratum and problem (a run is the
    same model on every benchmark), so every stratum must list the same runs in the same order."""
    pairs = [(_scores(m), _scores(b)) for m, b in strata]
    for m, b in pairs:
        if m.shape[0] != b.shape[0]:
            raise ValueError(f"paired by problem: {m.shape[0]} problems against {b.shape[0]}")
        if (m.shape[1], b.shape[1]) != (pairs[0][0].shape[1], pairs[0][1].shape[1]):
            raise ValueError("every stratum needs the same training runs")
    rng = np.random.default_rng(seed)
    runs_m_n, runs_b_n = pairs[0][0].shape[1], pairs[0][1].shape[1]
    per_run = [(m.mean(axis=2), b.mean(axis=2)) for m, b in pairs]  # [P, R]: seeds averaged within (problem, run)
    out = np.empty(n_boot)
    for start in range(0, n_boot, 1000):  # in blocks: memory stays ~1000 x problems
        k = min(1000, n_boot - start)
        runs_m = rng.integers(0, runs_m_n, size=(k, runs_m_n))
        runs_b = rng.integers(0, runs_b_n, size=(k, runs_b_n))
        total = np.zeros(k)
        for m_run, b_run in per_run:
            problems = rng.integers(0, m_run.shape[0], size=(k, m_run.shape[0]))
            diff = m_run[:, runs_m].mean(axis=2).T - b_run[:, runs_b].mean(axis=2).T  # [k, P]
            total += np.take_along_axis(diff, problems, axis=1).mean(axis=1)
        out[start : start + k] = total / len(per_run)
    return out


def sign_flip_p_value(differences: Sequence[float], *, max_exact: int = 20, n_perm: int = 100000,
                      seed: int = 0) -> float:
    """Two-sided p-value of a paired sign-flip permutation test of mean(differences) = 0.

    Problems with a zero difference cannot change sign and are left out of the enumeration. With at
    most ``max_exact`` others every sign assignment is enumerated (exact); otherwise ``n_perm``
    random ones are drawn and p = (1 + hits) / (1 + n_perm) (never 0)."""
    d = np.asarray(differences, dtype=float)
    d = d[d != 0]
    if d.size == 0:
        return 1.0
    observed = abs(d.sum())
    tol = 1e-9 * max(1.0, observed)
    if d.size <= max_exact:
        n = d.size
        hits = 0
        total = 1 << n
        for start in range(0, total, 1 << 16):  # sign patterns as the bits of consecutive integers
            codes = np.arange(start, min(total, start + (1 << 16)), dtype=np.int64)
            signs = 1.0 - 2.0 * ((codes[:, None] >> np.arange(n)) & 1)
            hits += int((np.abs(signs @ d) >= observed - tol).sum())
        return hits / total
    rng = np.random.default_rng(seed)
    hits = 0
    for start in range(0, n_perm, 10000):
        k = min(10000, n_perm - start)
        signs = rng.choice([-1.0, 1.0], size=(k, d.size))
        hits += int((np.abs(signs @ d) >= observed - tol).sum())
    return (1 + hits) / (1 + n_perm)


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error over the comparisons given), in the
    input's order: the i-th smallest p times (m - i + 1), made non-decreasing, capped at 1."""
    p = np.asarray(p_values, dtype=float)
    order = np.argsort(p, kind="stable")
    m = p.size
    adjusted = np.minimum(1.0, np.maximum.accumulate(p[order] * (m - np.arange(m))))
    out = np.empty(m)
    out[order] = adjusted
    return out


@dataclass(frozen=True)
class Comparison:
    """One method against the baseline on one (model, benchmark, metric), in points when scaled."""

    delta: float
    low: float
    high: float
    p_value: float
    problems: int
    method_runs: int
    baseline_runs: int
    eval_seeds: int

    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high


def compare(method, baseline, *, level: float = 0.95, n_boot: int = 10000, seed: int = 0, scale: float = 100.0,
            max_exact: int = 20, n_perm: int = 100000) -> Comparison:
    """Δ = method − baseline (× ``scale``: points for fractions), its ``level`` bootstrap interval
    and the sign-flip p-value over problems."""
    return compare_strata([(method, baseline)], level=level, n_boot=n_boot, seed=seed, scale=scale,
                          max_exact=max_exact, n_perm=n_perm)


def compare_strata(strata: Sequence[tuple], *, level: float = 0.95, n_boot: int = 10000, seed: int = 0,
                   scale: float = 100.0, max_exact: int = 20, n_perm: int = 100000) -> Comparison:
    """:func:`compare` for the mean over strata (benchmarks, equal weights) of the per-stratum
    deltas: stratified bootstrap, and a sign-flip test whose statistic is that mean, i.e. the sum
    of the problems' differences each weighted by 1 / (its stratum's problems)."""
    pairs = [(_scores(m), _scores(b)) for m, b in strata]
    diffs = [problem_differences(m, b) for m, b in pairs]
    delta = float(np.mean([d.mean() for d in diffs]))
    weighted = np.concatenate([d / d.size for d in diffs])
    low, high = percentile_interval(stratified_bootstrap_deltas(pairs, n_boot=n_boot, seed=seed), level)
    return Comparison(delta=delta * scale, low=low * scale, high=high * scale,
                      p_value=sign_flip_p_value(weighted, max_exact=max_exact, n_perm=n_perm, seed=seed),
                      problems=sum(d.size for d in diffs), method_runs=pairs[0][0].shape[1],
                      baseline_runs=pairs[0][1].shape[1], eval_seeds=min(min(m.shape[2], b.shape[2]) for m, b in pairs))


# -- from the per-seed metrics files of the evaluation (results/metrics/<model>/<ckpt>/<bench>/seed-<s>.json)

METRICS = {"avg": "Avg", "maj": "Maj", "pass": "Pass"}


def problem_scores(summaries: Sequence[dict], model: str, checkpoint: str, benchmark: str, metric: str) -> np.ndarray:
    """``[problems, 1, eval seeds]`` per-problem values of ``metric`` (fractions) for one checkpoint
    (one training run) on one benchmark, problems ordered by id and seeds by name; every seed must
    hold the same problems."""
    seeds = sorted((s for s in summaries if (s["model"], s["checkpoint"], s["benchmark"]) == (model, checkpoint, benchmark)),
                   key=lambda s: str(s["seed_name"]))
    if not seeds:
        raise ValueError(f"no metrics for {model}/{checkpoint}/{benchmark}")
    columns, ids = [], None
    for s in seeds:
        per = {str(p["problem_id"]): float(p[metric]) for p in s["problems"]}
        if ids is None:
            ids = sorted(per)
        elif sorted(per) != ids:
            raise ValueError(f"{model}/{checkpoint}/{benchmark}: seed {s['seed_name']} holds other problems")
        columns.append([per[i] for i in ids])
    return np.asarray(columns, dtype=float).T[:, None, :]


def run_scores(summaries: Sequence[dict], model: str, runs: Sequence[str], benchmark: str, metric: str) -> np.ndarray:
    """``[problems, runs, eval seeds]``: :func:`problem_scores` of each training run of a method."""
    parts = [problem_scores(summaries, model, run, benchmark, metric) for run in runs]
    if len({p.shape for p in parts}) != 1:
        raise ValueError(f"{model}/{benchmark}: the runs {list(runs)} hold other problems or seeds")
    return np.concatenate(parts, axis=1)


def significance_frame(summaries: Sequence[dict], comparisons: Sequence[tuple[str, str, str]], benchmarks: Sequence[str],
                       metrics: Sequence[str], *, runs: dict[str, Sequence[str]] | None = None, mean_name: str = "mean",
                       level: float = 0.95, n_boot: int = 10000, seed: int = 0, max_exact: int = 20,
                       n_perm: int = 100000) -> "pd.DataFrame":
    """One row per (model, method vs baseline, metric, benchmark or the mean column): Δ in points,
    its interval, p and Holm's adjustment over every row of the same metric (one table's family).
    ``runs``: each method's training runs (default: the method alone)."""
    import pandas as pd

    runs = runs or {}
    rows = []
    for metric in metrics:
        for model, method, baseline in comparisons:
            strata = [(run_scores(summaries, model, runs.get(method, [method]), b, metric),
                       run_scores(summaries, model, runs.get(baseline, [baseline]), b, metric)) for b in benchmarks]
            parts = [(b, [st]) for b, st in zip(benchmarks, strata)] + ([(mean_name, strata)] if len(strata) > 1 else [])
            for bench, group in parts:
                c = compare_strata(group, level=level, n_boot=n_boot, seed=seed, max_exact=max_exact, n_perm=n_perm)
                rows.append({"model": model, "method": method, "baseline": baseline, "metric": metric, "benchmark": bench,
                             "delta": c.delta, "low": c.low, "high": c.high, "p": c.p_value, "problems": c.problems,
                             "method_runs": c.method_runs, "baseline_runs": c.baseline_runs, "eval_seeds": c.eval_seeds})
    frame = pd.DataFrame(rows)
    frame["p_holm"] = np.nan
    for metric, idx in frame.groupby("metric").groups.items():
        frame.loc[idx, "p_holm"] = holm(frame.loc[idx, "p"].to_numpy())
    return frame
