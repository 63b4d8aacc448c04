"""The PW-OPSD position schedule and its fit to the branch-viability diagnostic.

* :func:`schedule_weight`: ``w(r) = w_min + (1 - w_min) * sigmoid((r - tau) / s)`` (paper §3.4) for
  NumPy arrays and torch tensors alike (the loss, the figures and the fit share it; the figures and
  the fit run in the analysis environment, which has no torch).
* :func:`fit_schedule`: the schedule's parameters fitted to teacher reliability as a function of
  normalized position (rule ``fit_schedule``, beyond the paper: its "schedule learned from the
  diagnostic" future work), with a cluster-bootstrap interval over problems for each parameter.

The fit is maximum likelihood on the **forced-continuation outcomes**: candidate ``i`` at normalized
position ``r_i`` had ``N_i`` forced continuations (children x rollouts) of which ``K_i`` recovered the
correct answer; ``K_i ~ Binomial(N_i, v_max * w(r_i))``. ``v_max`` (the viability of the latest
positions) is a nuisance parameter: the schedule is reliability *relative to* the most reliable
positions, so its ceiling is 1 as a training weight's is. Outcomes rather than the binary labels
because the labels drop the gray middle and threshold away how viable a candidate is; per-candidate
viability as a continuous target would ignore that each is a count of a few rollouts.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

PARAMS = ("w_min", "tau", "s")


def schedule_weight(r, *, w_min: float, tau: float, s: float):
    """The PW-OPSD schedule ``w(r)`` for a NumPy array (or float) or a torch tensor ``r``."""
    z = (r - tau) / max(float(s), 1e-6)
    sig = z.sigmoid() if hasattr(z, "sigmoid") else 0.5 * (1.0 + np.tanh(0.5 * np.asarray(z, dtype=float)))
    return w_min + (1.0 - w_min) * sig


class ScheduleFitError(ValueError):
    """The diagnostic's pool cannot identify a schedule (too few candidates, no variation)."""


# Unconstrained coordinates: w_min = sigmoid(a), tau = 2 sigmoid(b) - 0.5 (in [-0.5, 1.5]),
# s = exp(c) clipped to [S_MIN, S_MAX], v_max = sigmoid(d).
S_MIN, S_MAX = 0.005, 2.0


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _logit(p):
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


def _decode(theta) -> tuple[float, float, float, float]:
    a, b, c, d = theta
    return (float(_sigmoid(a)), float(2 * _sigmoid(b) - 0.5), float(min(max(math.exp(min(c, 5.0)), S_MIN), S_MAX)),
            float(_sigmoid(d)))


def _encode(w_min, tau, s, v_max):
    return np.array([_logit(w_min), _logit((tau + 0.5) / 2), math.log(s), _logit(v_max)])


def log_likelihood(r: np.ndarray, successes: np.ndarray, trials: np.ndarray, *, w_min: float, tau: float, s: float,
                   v_max: float) -> float:
    """Binomial log-likelihood (without the constant binomial coefficients)."""
    p = np.clip(v_max * schedule_weight(r, w_min=w_min, tau=tau, s=s), 1e-9, 1 - 1e-9)
    return float(np.sum(successes * np.log(p) + (trials - successes) * np.log1p(-p)))


def nelder_mead(f, x0: np.ndarray, *, step: float = 0.5, iters: int = 400, tol: float = 1e-9) -> np.ndarray:
    """Minimize ``f`` from ``x0`` with the Nelder-Mead simplex (standard coefficients)."""
    n = len(x0)
    simplex = [np.asarray(x0, dtype=float)] + [np.asarray(x0, dtype=float) + step * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(values)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if abs(values[-1] - values[0]) <= tol * (1 + abs(values[0])):
            break
        centroid = np.mean(simplex[:-1], axis=0)
        reflected = centroid + (centroid - simplex[-1])
        fr = f(reflected)
        if fr < values[0]:
            expanded = centroid + 2 * (centroid - simplex[-1])
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:  # shrink towards the best vertex
                simplex = [simplex[0]] + [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex[1:]]
                values = [values[0]] + [f(x) for x in simplex[1:]]
    return simplex[int(np.argmin(values))]


def _starts(r, successes, trials) -> list[np.ndarray]:
    rate = float(successes.sum() / trials.sum())
    late = r >= np.quantile(r, 0.75)
    v_max = float(np.clip(successes[late].sum() / max(trials[late].sum(), 1), max(rate, 0.05), 0.99))
    return [_encode(w_min, tau, s, v_max) for w_min in (0.1, 0.5) for tau in (0.2, 0.5, 0.8) for s in (0.05, 0.2)]


def fit_mle(r: Sequence[float], successes: Sequence[float], trials: Sequence[float],
            starts: list[np.ndarray] | None = None) -> dict[str, float]:
    """Maximum-likelihood ``(w_min, tau, s, v_max)`` from per-candidate continuation counts."""
    r, k, n = (np.asarray(x, dtype=float) for x in (r, successes, trials))

    def nll(theta):
        w_min, tau, s, v_max = _decode(theta)
        return -log_likelihood(r, k, n, w_min=w_min, tau=tau, s=s, v_max=v_max)

    starts = starts if starts is not None else _starts(r, k, n)
    # Polish the two best starting points; the likelihood is smooth but can have a flat ridge.
    ranked = sorted(starts, key=nll)[:2]
    best = min((nelder_mead(nll, x0) for x0 in ranked), key=nll)
    w_min, tau, s, v_max = _decode(best)
    return {"w_min": w_min, "tau": tau, "s": s, "v_max": v_max, "log_likelihood": -nll(best), "theta": best}


def fit_schedule(r: Sequence[float], successes: Sequence[float], trials: Sequence[float], groups: Sequence, *,
                 n_boot: int, seed: int, level: float, min_candidates: int, grid_points: int = 101) -> dict:
    """The fitted schedule, a cluster-bootstrap percentile interval for each parameter (problems
    resampled with replacement, each resample refitted) and the pointwise band of ``w(r)``.

    Raises :class:`ScheduleFitError` when the pool cannot identify a schedule: fewer than
    ``min_candidates`` candidates, fewer than two problems, or no variation in the outcomes (every
    continuation succeeded, or none did)."""
    r, k, n = (np.asarray(x, dtype=float) for x in (r, successes, trials))
    g = np.asarray(groups)
    problems = np.unique(g)
    if len(r) < min_candidates:
        raise ScheduleFitError(f"{len(r)} candidates with forced-continuation outcomes, fewer than "
                               f"diagnostic.fit_schedule.min_candidates={min_candidates}")
    if len(problems) < 2:
        raise ScheduleFitError(f"candidates from {len(problems)} problem(s): the bootstrap over problems needs at least 2")
    if k.sum() == 0 or k.sum() == n.sum():
        raise ScheduleFitError(f"every one of the {int(n.sum())} forced continuations "
                               + ("failed" if k.sum() == 0 else "recovered the answer")
                               + ": reliability does not vary, so no position schedule can be fitted")
    point = fit_mle(r, k, n)
    members = [np.flatnonzero(g == p) for p in problems]
    rng = np.random.default_rng(seed)
    grid = np.linspace(0.0, 1.0, grid_points)
    draws, curves = [], []
    for _ in range(n_boot):
        idx = np.concatenate([members[i] for i in rng.integers(0, len(problems), size=len(problems))])
        if k[idx].sum() in (0, n[idx].sum()):
            continue  # a resample without variation identifies nothing; counted as skipped
        fit = fit_mle(r[idx], k[idx], n[idx], starts=[point["theta"]] + _starts(r[idx], k[idx], n[idx])[::3])
        draws.append([fit[p] for p in (*PARAMS, "v_max")])
        curves.append(schedule_weight(grid, w_min=fit["w_min"], tau=fit["tau"], s=fit["s"]))
    draws_arr, curves_arr = np.asarray(draws), np.asarray(curves)
    alpha = (1 - level) / 2
    ci = {p: [float(np.quantile(draws_arr[:, j], alpha)), float(np.quantile(draws_arr[:, j], 1 - alpha))]
          for j, p in enumerate((*PARAMS, "v_max"))} if len(draws) else {p: [None, None] for p in (*PARAMS, "v_max")}
    curve = schedule_weight(grid, w_min=point["w_min"], tau=point["tau"], s=point["s"])
    band = (np.quantile(curves_arr, alpha, axis=0), np.quantile(curves_arr, 1 - alpha, axis=0)) if len(curves) else (curve, curve)
    return {
        "params": {p: point[p] for p in PARAMS},
        "v_max": point["v_max"],
        "log_likelihood": point["log_likelihood"],
        "ci": ci,
        "level": level,
        "n_boot": n_boot,
        "n_boot_used": len(draws),
        "pool": {"candidates": int(len(r)), "problems": int(len(problems)), "continuations": int(n.sum()),
                 "recovered": int(k.sum())},
        "curve": {"r": grid.round(6).tolist(), "w": curve.tolist(), "low": band[0].tolist(), "high": band[1].tolist()},
    }
