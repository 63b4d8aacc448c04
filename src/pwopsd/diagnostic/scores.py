"""The branch-viability diagnostic's Phase G (paper §3.2, Table 1): every score of each candidate
next to its label, the residualized AUROC / AUPRC with cluster-bootstrap intervals
(``branch_auroc.json``), and, beyond the paper, the position schedule fitted to the forced
continuations (rule ``fit_schedule``). Phases A-F: :mod:`pwopsd.diagnostic.phases`."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import numpy as np
import pandas as pd

from pwopsd.diagnostic import statistics as stats
from pwopsd.diagnostic.phases import CANDIDATE_KEY, PROBLEM_KEY

log = logging.getLogger(__name__)

# Scores of Table 1: column in the scored table -> row label (the paper's wording).
SCORES = {
    "h_full": "$H(\\mathbf{p}^{\\mathrm{opsd}}_t)$ (mean predictive entropy)",
    "mi": "$\\mathrm{MI}$ (canonical MC-dropout epistemic)",
    "log_kappa": "$\\log\\hat{\\kappa}$ (Dirichlet precision)",
    "h_trunc": "$h_{\\mathrm{trunc}}$ (top-$<top_m>$ valid entropy)",
    "early_position": "$1-\\widetilde r$ (early-position score)",
}


# ---------------------------------------------------------------------------------------------
# Phase G: scores


def scored_candidates(spines: pd.DataFrame, candidates: pd.DataFrame, mc: pd.DataFrame, labels: pd.DataFrame) -> pd.DataFrame:
    """One row per candidate with every score (raw; ``log_kappa`` = log max(kappa, 1e-6);
    ``early_position`` = 1 - r_tilde), its label and whether its spine is correct."""
    table = candidates.merge(mc, on=CANDIDATE_KEY, how="left").merge(labels, on=CANDIDATE_KEY, how="left")
    table = table.merge(spines[[*PROBLEM_KEY, "correct"]].rename(columns={"correct": "spine_correct"}), on=PROBLEM_KEY)
    table["log_kappa"] = [stats.log_kappa(k) if not pd.isna(k) else float("nan") for k in table["kappa"]]
    table["early_position"] = 1.0 - table["r_tilde"]
    return table


def _finite(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else float(x)


def diagnostic_pool(scored: pd.DataFrame, scores: dict) -> pd.DataFrame:
    """The candidates Table 1 and Figure 1 are computed on: those of correct spines when
    ``diagnostic.scores.correct_spines_only`` (the paper), else all."""
    return scored[scored["spine_correct"]] if scores["correct_spines_only"] else scored


def n_missing(values: pd.Series) -> int:
    """Candidates without a usable score: missing, or not finite (an MC-dropout precision of inf
    where the M distributions are identical, whose centring would give NaN and -inf)."""
    return int((~np.isfinite(pd.to_numeric(values, errors="coerce").to_numpy(dtype=float))).sum())


def branch_auroc_summary(scored: pd.DataFrame, spines: pd.DataFrame, settings: dict) -> dict[str, Any]:
    """Table 1's numbers: per score the within-problem residualized AUROC (real-uncertain = positive),
    its cluster-bootstrap interval, the AUPRC of the residualized score, and the pool's counts.

    Both orientations are computed from the same bootstrap draws: ``*_raw`` (the AUROC as is) and
    ``*_folded`` (``max(A, 1 - A)`` for the estimate and every draw, the convention the paper's
    intervals imply); ``auroc``/``ci_low``/``ci_high`` are the ones ``diagnostic.scores.orientation``
    selects for the table.

    Degenerate pools do not produce numbers: ``status`` says why (no correct spine, no candidate,
    a class missing) and the AUROC fields are ``None``.
    """
    sc = settings["scores"]
    pool = diagnostic_pool(scored, sc)
    binary = pool[pool["label"].isin([stats.REAL_UNCERTAIN, stats.DIVERSITY])].reset_index(drop=True)
    y = (binary["label"] == stats.REAL_UNCERTAIN).astype(int).to_numpy()
    groups = (binary["dataset"] + "/" + binary["problem_id"]).to_numpy()
    counts = {
        "problems": int(len(spines)),
        "correct_spines": int(spines["correct"].sum()),
        "fallback_spines": int((spines["decoding"] == "fallback").sum()),
        "candidates": int(len(scored)),
        "pool_candidates": int(len(pool)),
        "real_uncertain": int(y.sum()),
        "diversity": int(len(y) - y.sum()),
        "gray": int((pool["label"] == stats.GRAY).sum()),
        "problems_labelled": int(len(np.unique(groups))),
        "problems_per_dataset": {d: int(binary.loc[binary["dataset"] == d, "problem_id"].nunique())
                                 for d in spines["dataset"].unique()},
    }
    if counts["correct_spines"] == 0 and sc["correct_spines_only"]:
        status = "no spine is correct, so the correct-spine pool is empty"
    elif counts["candidates"] == 0:
        status = "no candidate position passed the Phase C filters"
    elif counts["real_uncertain"] == 0 and counts["diversity"] == 0:
        status = "every candidate is gray (no binary label)"
    elif counts["real_uncertain"] == 0:
        status = "no real-uncertain candidates, so the AUROC is undefined"
    elif counts["diversity"] == 0:
        status = "no diversity candidates, so the AUROC is undefined"
    else:
        status = "ok"
    rows = []
    t0 = time.time()
    orientation = sc["orientation"]
    for column, label in SCORES.items():
        label = label.replace("<top_m>", str(settings["teacher_pass"]["top_m"]))
        entry: dict[str, Any] = {"score": column, "label": label, "auroc": None, "ci_low": None, "ci_high": None,
                                 "auprc": None, "n_missing": n_missing(binary[column]) if column in binary else len(binary)}
        for o in stats.ORIENTATIONS:
            entry.update({f"auroc_{o}": None, f"ci_low_{o}": None, f"ci_high_{o}": None})
        if status == "ok" and entry["n_missing"] == 0:
            s = binary[column].to_numpy(dtype=float)
            raw = stats.residualized_auroc(s, y, groups)
            draws = stats.cluster_bootstrap_draws(s, y, groups, n_boot=int(sc["n_boot"]), seed=int(sc["seed"]))
            for o, value, d in (("raw", raw, draws), ("folded", stats.fold(raw), stats.fold(draws))):
                lo, hi = stats.percentile_interval(d, float(sc["level"]))
                entry.update({f"auroc_{o}": _finite(value), f"ci_low_{o}": _finite(lo), f"ci_high_{o}": _finite(hi)})
            entry.update(auroc=entry[f"auroc_{orientation}"], ci_low=entry[f"ci_low_{orientation}"],
                         ci_high=entry[f"ci_high_{orientation}"], auprc=_finite(stats.auprc(stats.residualize(s, groups), y)))
        rows.append(entry)
    log.info("scores: %d bootstrap intervals in %.1fs", len(rows), time.time() - t0)
    return {"status": status, "counts": counts, "positive_rate": _finite(float(y.mean())) if len(y) else None,
            "orientation": orientation,
            "scores": rows, "settings": {k: settings[k] for k in ("scores", "labels")}}


# ---------------------------------------------------------------------------------------------
# Beyond the paper: the position schedule fitted to the diagnostic (rule fit_schedule)


def continuation_outcomes(scored: pd.DataFrame, scores: dict) -> pd.DataFrame:
    """Per candidate of the diagnostic pool (:func:`diagnostic_pool`, gray ones included) with
    forced continuations: normalized position ``r_tilde``, continuations that recovered the answer
    (``recovered`` = mean child viability x continuations; every child has the same number) and
    ``continuations``, and the problem (``group``) the bootstrap resamples."""
    pool = diagnostic_pool(scored, scores)
    pool = pool[pool["n_continuations"] > 0]
    return pd.DataFrame({
        "r_tilde": pool["r_tilde"].to_numpy(dtype=float),
        "recovered": np.rint(pool["mean_viability"].to_numpy(dtype=float) * pool["n_continuations"].to_numpy()),
        "continuations": pool["n_continuations"].to_numpy(dtype=float),
        "group": (pool["dataset"] + "/" + pool["problem_id"]).to_numpy(),
    })


def fitted_schedule(scored: pd.DataFrame, settings: dict, *, model: str) -> dict[str, Any]:
    """The PW-OPSD schedule fitted to the model's forced-continuation outcomes
    (:func:`pwopsd.schedule.fit_schedule`); a pool that cannot identify one raises
    :class:`pwopsd.schedule.ScheduleFitError` naming the model."""
    from pwopsd.schedule import ScheduleFitError, fit_schedule

    fs = settings["fit_schedule"]
    data = continuation_outcomes(scored, settings["scores"])
    try:
        fit = fit_schedule(data["r_tilde"], data["recovered"], data["continuations"], data["group"],
                           n_boot=int(fs["n_boot"]), seed=int(fs["seed"]), level=float(fs["level"]),
                           min_candidates=int(fs["min_candidates"]))
    except ScheduleFitError as exc:
        raise ScheduleFitError(f"diagnostic of {model}: {exc} (results/diagnostic/{model}/scored.parquet)") from None
    return {"model": model, "fit": "maximum likelihood, binomial forced-continuation outcomes ~ v_max * w(r_tilde)",
            **fit, "settings": {k: settings[k] for k in ("fit_schedule", "scores")}}
