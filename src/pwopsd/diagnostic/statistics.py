"""Statistics of the branch-viability diagnostic (paper §3.2, Appendices A-B).

* :func:`auroc` (Mann-Whitney U with mid-ranks) and :func:`auprc` (average precision);
* :func:`residualize` (within-problem mean-centering) and :func:`residualized_auroc`;
* :func:`cluster_bootstrap_ci`: resample *problems* with replacement (a problem drawn twice counts as
  two clusters), recompute the residualization on every resample, percentile interval; raw or
  folded (:func:`fold`, every draw taken as ``max(A, 1 - A)``, the paper's Table 1 convention);
* :func:`mc_dropout_scores`: full entropy of the mean, mutual information and the moment-matched
  Dirichlet precision from M MC-dropout distributions; :func:`log_kappa` at score time.

Labels: 1 = real-uncertain (the positive class), 0 = diversity.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

DIVERSITY = "diversity"
REAL_UNCERTAIN = "real_uncertain"
GRAY = "gray"


def mid_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks with ties given their average rank."""
    x = np.asarray(x, dtype=float)
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=float)
    sorted_x = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sorted_x[j + 1] == sorted_x[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def auroc(scores: Sequence[float], labels: Sequence[int]) -> float:
    """P(score of a positive > score of a negative) + 0.5 P(tie); NaN without both classes."""
    s = np.asarray(scores, dtype=float)
    y = np.asarray(labels).astype(bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    r = mid_ranks(s)
    u = r[y].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def auprc(scores: Sequence[float], labels: Sequence[int]) -> float:
    """Average precision: sum over distinct thresholds (descending) of recall gain x precision."""
    s = np.asarray(scores, dtype=float)
    y = np.asarray(labels).astype(bool)
    n_pos = int(y.sum())
    if n_pos == 0:
        return float("nan")
    ap, tp, fp, prev_recall = 0.0, 0, 0, 0.0
    for thr in np.unique(s)[::-1]:
        at = s == thr
        tp += int((y & at).sum())
        fp += int((~y & at).sum())
        recall = tp / n_pos
        ap += (recall - prev_recall) * tp / (tp + fp)
        prev_recall = recall
    return float(ap)


# Residuals are rounded to this many decimals: a mean computed in floating point leaves equal
# centred scores of two problems (e.g. positions 0.1, 0.3 and 0.5, 0.7) a last bit apart, and
# Mann-Whitney's mid-ranks would count such a pair as won or lost instead of tied.
RESIDUAL_DECIMALS = 12


def residualize(scores: Sequence[float], groups: Sequence) -> np.ndarray:
    """Subtract each group's mean score (within-problem mean-centering), rounded to
    :data:`RESIDUAL_DECIMALS` decimals so that equal residuals tie."""
    s = np.asarray(scores, dtype=float)
    g = np.asarray(groups)
    out = np.empty_like(s)
    for key in np.unique(g):
        idx = g == key
        out[idx] = s[idx] - s[idx].mean()
    return np.round(out, RESIDUAL_DECIMALS) + 0.0  # + 0.0: no negative zero


def residualized_auroc(scores: Sequence[float], labels: Sequence[int], groups: Sequence) -> float:
    return auroc(residualize(scores, groups), labels)


ORIENTATIONS = ("raw", "folded")


def fold(value):
    """``max(A, 1 - A)``: the AUROC of the better of a score and its negation, for one value or
    an array of bootstrap draws (NaN stays NaN)."""
    folded = np.maximum(value, 1.0 - np.asarray(value, dtype=float))
    return float(folded) if np.ndim(folded) == 0 else folded


def cluster_bootstrap_draws(scores: Sequence[float], labels: Sequence[int], groups: Sequence, *, n_boot: int = 2000,
                            seed: int = 0) -> np.ndarray:
    """Residualized AUROCs of ``n_boot`` cluster-bootstrap resamples over problems.

    Each resample draws as many problems as there are, with replacement; a problem drawn k times
    contributes k separate clusters, and the residualization is recomputed on the resample.
    Resamples without both classes are skipped (so fewer than ``n_boot`` values may come back).
    """
    s = np.asarray(scores, dtype=float)
    y = np.asarray(labels).astype(int)
    g = np.asarray(groups)
    keys = np.unique(g)
    members = [np.flatnonzero(g == k) for k in keys]
    rng = np.random.default_rng(seed)
    stats = []
    for _ in range(n_boot):
        draw = rng.integers(0, len(keys), size=len(keys))
        idx = np.concatenate([members[d] for d in draw])
        new_groups = np.concatenate([np.full(len(members[d]), c) for c, d in enumerate(draw)])
        value = residualized_auroc(s[idx], y[idx], new_groups)
        if not np.isnan(value):
            stats.append(value)
    return np.asarray(stats, dtype=float)


def percentile_interval(draws: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Equal-tailed percentile interval of bootstrap draws (NaN interval without draws)."""
    d = np.asarray(draws, dtype=float)
    if d.size == 0:
        return float("nan"), float("nan")
    alpha = (1 - level) / 2
    return float(np.quantile(d, alpha)), float(np.quantile(d, 1 - alpha))


def cluster_bootstrap_ci(scores: Sequence[float], labels: Sequence[int], groups: Sequence, *, n_boot: int = 2000,
                         seed: int = 0, level: float = 0.95, orientation: str = "raw") -> tuple[float, float]:
    """Percentile interval of the residualized AUROC under a bootstrap over problems
    (:func:`cluster_bootstrap_draws`). ``orientation="folded"`` folds every draw to
    ``max(A, 1 - A)`` before taking percentiles (the convention the paper's Table 1 intervals imply:
    lower bounds of exactly 0.50); a folded interval never reaches below 0.5 and is biased upward.
    """
    if orientation not in ORIENTATIONS:
        raise ValueError(f"orientation must be one of {ORIENTATIONS}, got {orientation!r}")
    draws = cluster_bootstrap_draws(scores, labels, groups, n_boot=n_boot, seed=seed)
    return percentile_interval(fold(draws) if orientation == "folded" else draws, level)


def mc_dropout_scores(probs: np.ndarray) -> dict[str, float]:
    """Scores from M MC-dropout distributions ``[M, V]`` at one position.

    ``h_full``: entropy of the mean distribution; ``mi``: h_full minus the mean entropy of the
    samples; ``kappa``: moment-matched Dirichlet precision ``(1 - ||p_bar||^2) / tr(Var) - 1`` with
    the unbiased sample variance (raw: it can be negative for small M, as the paper notes).
    """
    p = np.asarray(probs, dtype=float)
    m = p.shape[0]
    if m < 2:
        raise ValueError("MC-dropout scores need at least two samples")
    p_bar = p.mean(axis=0)

    def entropy(q):
        q = q[q > 0]
        return float(-(q * np.log(q)).sum())

    h_full = entropy(p_bar)
    mi = h_full - float(np.mean([entropy(row) for row in p]))
    trace_var = float(((p - p_bar) ** 2).sum() / (m - 1))
    kappa = (1.0 - float((p_bar**2).sum())) / trace_var - 1.0 if trace_var > 0 else float("inf")
    return {"h_full": h_full, "mi": mi, "kappa": kappa}


def log_kappa(kappa: float, eps: float = 1e-6) -> float:
    """``log max(kappa, eps)``, applied at score time only."""
    return float(np.log(max(kappa, eps)))


def binned_rates(values: np.ndarray, failure: np.ndarray, bins: int, *, quantile: bool) -> pd.DataFrame:
    """Mean failure rate per bin of ``values`` (equal-width on [0, 1], or quantile bins)."""
    values, failure = np.asarray(values, float), np.asarray(failure, float)
    if len(values) == 0:
        return pd.DataFrame(columns=["bin", "lo", "hi", "center", "n", "failure_rate"])
    edges = np.unique(np.quantile(values, np.linspace(0, 1, bins + 1))) if quantile else np.linspace(0, 1, bins + 1)
    if len(edges) < 2:
        edges = np.array([values.min(), values.max() + 1e-12])
    idx = np.clip(np.searchsorted(edges, values, side="right") - 1, 0, len(edges) - 2)
    rows = []
    for b in range(len(edges) - 1):
        sel = idx == b
        rows.append({"bin": b, "lo": edges[b], "hi": edges[b + 1], "center": values[sel].mean() if sel.any() else
                     (edges[b] + edges[b + 1]) / 2, "n": int(sel.sum()),
                     "failure_rate": float(failure[sel].mean()) if sel.any() else float("nan")})
    return pd.DataFrame(rows)
