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
    m, b = _scores(method), _scores(baseline)
    n_problems = m.shape[0]
    if b.shape[0] != n_problems:
        raise ValueError(f"paired by problem: {n_problems} problems against {b.shape[0]}")
    rng = np.random.default_rng(seed)
    m_run = m.mean(axis=2)  # [P, R]: eval seeds kept, averaged within each (problem, run)
    b_run = b.mean(axis=2)
    out = np.empty(n_boot)
    for start in range(0, n_boot, 1000):  # in blocks: memory stays ~1000 x problems
        k = min(1000, n_boot - start)
        problems = rng.integers(0, n_problems, size=(k, n_problems))
        runs_m = rng.integers(0, m_run.shape[1], size=(k, m_run.shape[1]))
        runs_b = rng.integers(0, b_run.shape[1], size=(k, b_run.shape[1]))
        # mean over resampled runs for every problem, then over resampled problems
        per_m = m_run[:, runs_m].mean(axis=2).T  # [k, P]
        per_b = b_run[:, runs_b].mean(axis=2).T
        diff = per_m - per_b
        out[start : start + k] = np.take_along_axis(diff, problems, axis=1).mean(axis=1)
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
    m, b = _scores(method), _scores(baseline)
    diffs = problem_differences(m, b)
    low, high = percentile_interval(bootstrap_deltas(m, b, n_boot=n_boot, seed=seed), level)
    return Comparison(delta=float(diffs.mean()) * scale, low=low * scale, high=high * scale,
                      p_value=sign_flip_p_value(diffs, max_exact=max_exact, n_perm=n_perm, seed=seed),
                      problems=m.shape[0], method_runs=m.shape[1], baseline_runs=b.shape[1],
                      eval_seeds=min(m.shape[2], b.shape[2]))
