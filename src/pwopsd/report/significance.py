"""Is a method's gain real? Paired comparison of two methods over problems, training runs and eval seeds.

The data of one comparison (one model, benchmark and metric) are two arrays of per-problem scores,
``method[p, r, e]`` and ``baseline[p, r, e]``: problem ``p`` (the same problems, in the same order,
for both), training run ``r`` (one per training seed; the two methods' runs are not paired), eval
seed ``e`` (the metric of that problem's samples under that seed: Avg@12 as a fraction, Maj@12 and
Pass@12 as 0/1). The difference of the two methods is the mean over problems of their per-problem
means over runs and seeds (:func:`paired_delta`), i.e. exactly the difference of the two table
cells.

Interval and p come from one model (:func:`mixed_model_fit`), so that "the interval excludes 0"
and "p < 1 - level" always agree. The model is the linear mixed model of the design, with the eval
seeds averaged within (problem, run)::

    y[m, r, p] = mu_m + u_p + (mu u)_{m,p} + v_{m,r} + w_{m,r,p}

- ``u_p``, the problem's difficulty, is shared by both methods: the pairing removes it;
- ``(mu u)_{m,p}``, how much the method helps on this problem, is random (problems are a sample of
  the benchmark's population) and with ``w`` (the problem-by-run noise, eval-seed noise included)
  makes the spread of the per-problem differences: the term ``Q``, the variance of their mean;
- ``v_{m,r}``, a training run's own level, shared by all problems of the run (a good run is good on
  all of them), with one variance ``sigma_run^2`` for both methods: estimated from the spread of
  each run's mean score beyond what the problem-by-run noise explains (the balanced design's ANOVA
  estimator, pooled over methods with at least 2 runs, truncated at 0 as REML is).

Var(delta) = Q + sigma_run^2 (1 / R_method + 1 / R_baseline); its degrees of freedom are
Satterthwaite's (1946) for that combination of mean squares, which is what Kenward and Roger's
(1997) small-sample correction reduces to in a balanced design (see Searle, Casella and McCulloch,
*Variance Components*, 1992, ch. 4). With one run per method (the paper's design) sigma_run cannot
be estimated: the comparison is then a paired t-test over problems and neither its interval nor
its p includes training-seed variance (:attr:`Comparison.run_variance_included` is False and the
tables say so; ``python -m pwopsd.power`` tells how many runs a gain needs). The calibration (the
interval's coverage and p's false-positive rate by simulation, per run sd and number of runs) is
rebuilt by tests/test_significance.py and reported in docs/decisions.md.

Several comparisons of one table: Holm's step-down correction (:func:`holm`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np


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


# -- Student's t distribution (non-integer degrees of freedom: Satterthwaite's)

def regularized_incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), by its continued fraction (modified Lentz), on the side where it converges fast."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - regularized_incomplete_beta(b, a, 1.0 - x)
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    floor = 1e-300
    f, c, d = 1.0, 1.0, 0.0
    for i in range(1000):
        k = i // 2
        if i == 0:
            term = 1.0
        elif i % 2 == 0:
            term = k * (b - k) * x / ((a + 2 * k - 1) * (a + 2 * k))
        else:
            term = -(a + k) * (a + b + k) * x / ((a + 2 * k) * (a + 2 * k + 1))
        d = 1.0 + term * d
        d = 1.0 / (d if abs(d) > floor else floor)
        c = 1.0 + term / c
        c = c if abs(c) > floor else floor
        f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            return math.exp(log_front) * (f - 1.0) / a
    raise ArithmeticError(f"incomplete beta I_{x}({a}, {b}) did not converge")


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, not {df}")
    if math.isinf(t):
        return 0.0
    return regularized_incomplete_beta(df / 2.0, 0.5, df / (df + t * t))


def t_density(t: float, df: float) -> float:
    """Student's t density."""
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    return math.exp(log_c - (df + 1) / 2 * math.log1p(t * t / df))


def t_quantile(q: float, df: float) -> float:
    """The ``q`` quantile of Student's t (0.5 < q < 1): Newton's method on :func:`t_two_sided_p`,
    kept inside a bracket that bisection narrows whenever a Newton step would leave it."""
    if not 0.5 < q < 1.0:
        raise ValueError(f"quantile level must lie in (0.5, 1), not {q}")
    target, low, high = 2.0 * (1.0 - q), 0.0, 1.0
    while t_two_sided_p(high, df) > target:
        low, high = high, 2.0 * high
    t = 0.5 * (low + high)
    for _ in range(400):
        excess = t_two_sided_p(t, df) - target  # decreasing in t
        if excess == 0.0:
            return t
        low, high = (t, high) if excess > 0 else (low, t)
        density = t_density(t, df)
        step = excess / (2.0 * density) if density > 0 else math.inf
        if abs(step) <= 1e-14 * t:  # converged: the step no longer moves t
            return t
        t = t + step if low < t + step < high else 0.5 * (low + high)  # Newton inside the bracket, else bisection
        if high - low <= 1e-14 * high:
            return 0.5 * (low + high)
    return t


# -- the mixed model of the design

@dataclass(frozen=True)
class MixedModelFit:
    """The method-minus-baseline difference (a fraction) with its variance and degrees of freedom."""

    delta: float
    variance: float
    df: float
    run_variance: float | None  # sigma_run^2; None when no method has 2 runs (not estimable)


def _satterthwaite(terms: Sequence[tuple[float, float, float]]) -> tuple[float, float]:
    """Sum and Satterthwaite degrees of freedom of ``coefficient x mean square`` terms, each
    ``(coefficient, mean square, its degrees of freedom)``."""
    total = sum(c * ms for c, ms, _ in terms)
    spread = sum((c * ms) ** 2 / df for c, ms, df in terms if ms)
    return total, (total * total / spread if spread > 0 else math.inf)


def mixed_model_fit(strata: Sequence[tuple]) -> MixedModelFit:
    """The model of the module docstring for the mean over strata (benchmarks, equal weights) of
    each stratum's :func:`paired_delta`. ``strata``: ``(method, baseline)`` score arrays; a run is
    the same model on every benchmark, so every stratum must list the same runs in the same order
    (one run level ``v`` per run, shared by the strata). A baseline of ``None`` fits the method's
    own mean score (its interval, as a sweep plots it)."""
    pairs = [(_scores(m).mean(axis=2), None if b is None else _scores(b).mean(axis=2)) for m, b in strata]  # [P, R]
    runs = [(m.shape[1], None if b is None else b.shape[1]) for m, b in pairs]
    for (m, b), r in zip(pairs, runs):
        if b is not None and m.shape[0] != b.shape[0]:
            raise ValueError(f"paired by problem: {m.shape[0]} problems against {b.shape[0]}")
        if r != runs[0]:
            raise ValueError("every stratum needs the same training runs")
        if m.shape[0] < 2:
            raise ValueError("a benchmark needs at least 2 problems for the spread of its differences")
    n = len(pairs)
    weights = np.concatenate([np.full(m.shape[0], 1.0 / (n * m.shape[0])) for m, _ in pairs])  # per problem
    diffs = [m.mean(axis=1) - (0.0 if b is None else b.mean(axis=1)) for m, b in pairs]
    delta = float(sum(d.mean() for d in diffs) / n)
    # Q: the spread of the per-problem differences within each benchmark (one mean square each).
    terms = [(1.0 / (n * n * d.size), float(d.var(ddof=1)), d.size - 1.0) for d in diffs]
    # sigma_run^2 from each side with >= 2 runs: var of run means minus the problem-by-run noise in them.
    sum_w2 = float((weights ** 2).sum())
    run_parts = []
    for side in (0, 1):
        if pairs[0][side] is None or pairs[0][side].shape[1] < 2:
            continue
        y = np.concatenate([pair[side] for pair in pairs], axis=0)  # [all problems, runs]
        r = y.shape[1]
        run_means = weights @ y
        per_problem = y.var(axis=1, ddof=1)
        run_parts.append((r - 1.0, [(1.0, float(run_means.var(ddof=1)), r - 1.0)]
                          + [(-(wj ** 2), float(v), r - 1.0) for wj, v in zip(weights, per_problem)]))
    run_variance = None
    floor = min(d.size - 1.0 for d in diffs)  # the degrees of freedom of the smallest part
    if run_parts:
        pooled_df = sum(df for df, _ in run_parts)
        scale = 1.0 / ((1.0 - sum_w2) * pooled_df)  # sigma_run^2 = sum_m df_m (their terms) x scale
        run_terms = [(c * df * scale, ms, d) for df, part in run_parts for c, ms, d in part]
        run_variance = sum(c * ms for c, ms, _ in run_terms)
        if run_variance > 0:  # at the boundary (<= 0) the run term is 0 and adds no degrees of freedom
            factor = sum(1.0 / r for r in runs[0] if r)
            terms += [(c * factor, ms, d) for c, ms, d in run_terms]
            floor = min(floor, pooled_df)
        run_variance = max(0.0, run_variance)
    variance, df = _satterthwaite(terms)
    # Satterthwaite's df of a sum of positive parts is at least its smallest part's; the run term's
    # negative part (the problem-by-run noise it removes) can pull it far below when sigma_run^2 is
    # barely above 0 (df 0.5: intervals of hundreds of points): it is held at that floor.
    return MixedModelFit(delta=delta, variance=max(0.0, variance), df=max(df, floor), run_variance=run_variance)


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
    df: float
    problems: int
    method_runs: int
    baseline_runs: int
    eval_seeds: int
    run_variance_included: bool  # False: one run per method, training-seed variance not estimable

    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high


def compare(method, baseline, *, level: float = 0.95, scale: float = 100.0) -> Comparison:
    """Δ = method − baseline (× ``scale``: points for fractions), its ``level`` interval and the
    two-sided p of "Δ = 0", both from :func:`mixed_model_fit`."""
    return compare_strata([(method, baseline)], level=level, scale=scale)


def compare_strata(strata: Sequence[tuple], *, level: float = 0.95, scale: float = 100.0) -> Comparison:
    """:func:`compare` for the mean over strata (benchmarks, equal weights) of the per-stratum deltas
    (baselines ``None``: the method's own mean and its interval, tested against 0)."""
    fit = mixed_model_fit(strata)
    se = math.sqrt(fit.variance)
    if se > 0:
        half = t_quantile(0.5 + level / 2, fit.df) * se
        p = t_two_sided_p(fit.delta / se, fit.df)
    else:  # no spread at all: every problem and run differs by exactly delta
        half, p = 0.0, (1.0 if fit.delta == 0 else 0.0)
    shapes = [(_scores(m).shape, _scores(b if b is not None else m).shape) for m, b in strata]
    return Comparison(delta=fit.delta * scale, low=(fit.delta - half) * scale, high=(fit.delta + half) * scale,
                      p_value=p, df=fit.df, problems=sum(m[0] for m, _ in shapes), method_runs=shapes[0][0][1],
                      baseline_runs=0 if strata[0][1] is None else shapes[0][1][1],
                      eval_seeds=min(min(m[2], b[2]) for m, b in shapes), run_variance_included=fit.run_variance is not None)


# -- from the per-seed metrics files of the evaluation (results/metrics/<model>/<ckpt>/<bench>/seed-<s>.json)

METRICS = {"avg": "Avg", "maj": "Maj", "pass": "Pass"}


def problem_table(summaries: Sequence[dict], model: str, checkpoint: str, benchmark: str,
                  metric: str) -> tuple[list[str], np.ndarray]:
    """The problem ids (sorted) and the ``[problems, 1, eval seeds]`` per-problem values of
    ``metric`` (fractions) for one checkpoint (one training run) on one benchmark, seeds ordered by
    name; every seed must hold the same problems."""
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
    return ids, np.asarray(columns, dtype=float).T[:, None, :]


def problem_scores(summaries: Sequence[dict], model: str, checkpoint: str, benchmark: str, metric: str) -> np.ndarray:
    """``[problems, 1, eval seeds]``: the values of :func:`problem_table`, problems ordered by id."""
    return problem_table(summaries, model, checkpoint, benchmark, metric)[1]


def _same_problems(model: str, benchmark: str, named: Sequence[tuple[str, list[str]]]) -> None:
    """Scores are paired by position in the sorted ids: every checkpoint must hold the same problems."""
    first, ids = named[0]
    for other, theirs in named[1:]:
        if theirs != ids:
            only = sorted(set(ids) ^ set(theirs))
            raise ValueError(f"{model}/{benchmark}: {other} and {first} hold other problems, so they cannot be "
                             f"paired by problem (in one only: {only[:5]}{' ...' if len(only) > 5 else ''})")


def _run_table(summaries: Sequence[dict], model: str, runs: Sequence[str], benchmark: str,
               metric: str) -> tuple[list[str], np.ndarray]:
    tables = [problem_table(summaries, model, run, benchmark, metric) for run in runs]
    _same_problems(model, benchmark, [(run, ids) for run, (ids, _) in zip(runs, tables)])
    if len({t.shape for _, t in tables}) != 1:
        raise ValueError(f"{model}/{benchmark}: the runs {list(runs)} hold other seeds")
    return tables[0][0], np.concatenate([t for _, t in tables], axis=1)


def run_scores(summaries: Sequence[dict], model: str, runs: Sequence[str], benchmark: str, metric: str) -> np.ndarray:
    """``[problems, runs, eval seeds]``: :func:`problem_scores` of each training run of a method
    (every run holding the same problems)."""
    return _run_table(summaries, model, runs, benchmark, metric)[1]


def benchmark_strata(summaries: Sequence[dict], model: str, method_runs: Sequence[str], baseline_runs: Sequence[str],
                     benchmarks: Sequence[str], metric: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """One ``(method, baseline)`` pair of :func:`run_scores` arrays per benchmark: the strata of
    :func:`compare_strata`."""
    strata = []
    for b in benchmarks:
        (ids, method), (base_ids, baseline) = (_run_table(summaries, model, r, b, metric) for r in (method_runs, baseline_runs))
        _same_problems(model, b, [(method_runs[0], ids), (baseline_runs[0], base_ids)])
        strata.append((method, baseline))
    return strata


def significance_frame(summaries: Sequence[dict], comparisons: Sequence[tuple[str, str, str]], benchmarks: Sequence[str],
                       metrics: Sequence[str], *, runs: dict[str, Sequence[str]] | None = None, mean_name: str = "mean",
                       level: float = 0.95) -> "pd.DataFrame":
    """One row per (model, method vs baseline, metric, benchmark or the mean column): Δ in points,
    its interval, p and Holm's adjustment over every row of the same metric (one table's family).
    ``runs``: each method's training runs (default: the method alone)."""
    import pandas as pd

    runs = runs or {}
    rows = []
    for metric in metrics:
        for model, method, baseline in comparisons:
            strata = benchmark_strata(summaries, model, runs.get(method, [method]), runs.get(baseline, [baseline]),
                                      benchmarks, metric)
            parts = [(b, [st]) for b, st in zip(benchmarks, strata)] + ([(mean_name, strata)] if len(strata) > 1 else [])
            for bench, group in parts:
                c = compare_strata(group, level=level)
                rows.append({"model": model, "method": method, "baseline": baseline, "metric": metric, "benchmark": bench,
                             "delta": c.delta, "low": c.low, "high": c.high, "p": c.p_value, "df": c.df,
                             "problems": c.problems, "method_runs": c.method_runs, "baseline_runs": c.baseline_runs,
                             "eval_seeds": c.eval_seeds, "run_variance_included": c.run_variance_included})
    frame = pd.DataFrame(rows)
    frame["p_holm"] = np.nan
    for metric, idx in frame.groupby("metric").groups.items():
        frame.loc[idx, "p_holm"] = holm(frame.loc[idx, "p"].to_numpy())
    return frame


def gains_over_base(summaries: Sequence[dict], model: str, runs: Sequence[str], benchmarks: Sequence[str], *,
                    metric: str = "avg", base: str = "base", level: float = 0.95) -> dict[str, Comparison]:
    """Each training run against the model it started from, one run at a time (``run − base`` on
    the mean over ``benchmarks``, paired over problems with the eval seeds averaged within each
    problem: :func:`compare_strata`). Tiny mode's learning test asks every run of OPSD and
    PW-OPSD for an interval above 0, and a broken training (no privileged solution, or teacher =
    student) for none."""
    return {run: compare_strata(benchmark_strata(summaries, model, [run], [base], benchmarks, metric), level=level)
            for run in runs}


def learning_problems(gains: dict[str, Comparison]) -> list[str]:
    """The runs whose interval does not lie above 0, as readable lines (empty: every run learned)."""
    return [f"{run}: {c.delta:+.2f} points over the base model, {c.low:+.2f} to {c.high:+.2f} (p = {c.p_value:.3g}): "
            "not above 0" for run, c in gains.items() if not c.low > 0]
