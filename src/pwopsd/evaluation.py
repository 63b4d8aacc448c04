"""Generations -> graded samples -> per-problem and per-seed metrics (rule ``grade``), and the
seed aggregate (rule ``aggregate_metrics``)."""

from __future__ import annotations

import logging
import time
from typing import Any

import pandas as pd

from .grading import STATUS_TIMEOUT, GraderPool, extract_boxed
from .metrics import METRICS, aggregate_seeds, clustering_pairs, maj_clusters, metrics_from_grades

log = logging.getLogger(__name__)


def grade_generations(generations: pd.DataFrame, benchmark: pd.DataFrame, pool: GraderPool) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Grade every sample and compute every problem's metrics.

    Returns (graded samples, per-problem metrics). All gold comparisons and all clustering
    comparisons are sent to the pool as one batch, so identical pairs are graded once.
    """
    gold = benchmark.set_index("id")["answer"].astype(str)
    missing = set(generations["problem_id"]) - set(gold.index)
    if missing:
        raise ValueError(f"generations refer to problems not in the benchmark: {sorted(missing)[:5]}")
    df = generations.sort_values(["problem_id", "sample_index"], kind="stable").reset_index(drop=True)
    df["extracted"] = df["text"].map(extract_boxed)
    df["formatted"] = df["extracted"].notna()

    t0 = time.time()
    grades = pool.grade_pairs([(gold[pid], pred) for pid, pred in zip(df["problem_id"], df["extracted"])])
    df["correct"] = [g.correct for g in grades]
    df["grade_status"] = [g.status for g in grades]
    df["grade_seconds"] = [round(g.seconds, 6) for g in grades]

    groups = {pid: grp for pid, grp in df.groupby("problem_id", sort=False)}
    pairs = sorted({pair for grp in groups.values() for pair in clustering_pairs(list(grp["extracted"].where(grp["formatted"], None)))})
    eq = pool.grade_pairs([(ref, pred, False) for ref, pred in pairs])
    table = {pair: g.correct for pair, g in zip(pairs, eq)}
    equivalent = lambda ref, pred: table.get((ref, pred), False)  # noqa: E731
    log.info("graded %d samples and %d clustering pairs in %.1fs (%s)", len(df), len(pairs), time.time() - t0, pool.stats)

    rows, labels = [], {}
    for pid, grp in groups.items():
        preds = [p if f else None for p, f in zip(grp["extracted"], grp["formatted"])]
        m = metrics_from_grades(preds, list(grp["correct"]), equivalent)
        lab, winner = maj_clusters([p is not None for p in preds], lambda i, j: equivalent(preds[j], preds[i]))
        for idx, label in zip(grp.index, lab):
            labels[idx] = label
        rows.append({"problem_id": pid, "n": len(grp), "gold": gold[pid], "maj_winner": winner, **m})
    df["maj_cluster"] = pd.Series(labels)
    return df, pd.DataFrame(rows)


def seed_summary(problems: pd.DataFrame) -> dict[str, float]:
    """Benchmark-level metrics in percent (means over problems)."""
    return {m: float(100 * problems[m].mean()) for m in METRICS}


def grade_run(generations: pd.DataFrame, benchmark: pd.DataFrame, *, pool: GraderPool, meta: dict[str, Any]) -> tuple[pd.DataFrame, dict]:
    graded, problems = grade_generations(generations, benchmark, pool)
    summary = {
        **meta,
        "num_problems": int(len(problems)),
        "num_samples": int(len(graded)),
        "metrics_pct": seed_summary(problems),
        "grading": {"timeouts": int((graded["grade_status"] == STATUS_TIMEOUT).sum()), **pool.stats},
        "problems": problems.to_dict(orient="records"),
    }
    return graded, summary


def seed_table(summaries: list[dict]) -> pd.DataFrame:
    """Tidy per-seed rows ``model, checkpoint, benchmark, seed, metric, value`` from metric JSONs."""
    rows = []
    for s in summaries:
        for metric, value in s["metrics_pct"].items():
            rows.append({"model": s["model"], "checkpoint": s["checkpoint"], "benchmark": s["benchmark"],
                         "seed": s["seed_name"], "metric": metric, "value": value})
    return pd.DataFrame(rows)


def aggregate(summaries: list[dict], benchmarks: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-seed table, aggregate over seeds with the equal-weight benchmark mean)."""
    per_seed = seed_table(summaries)
    agg = aggregate_seeds(per_seed, benchmarks_for_mean=benchmarks)
    order = {b: i for i, b in enumerate(list(benchmarks) + ["mean"])}
    agg = agg.sort_values(["model", "checkpoint", "metric", "benchmark"], key=lambda c: c.map(order) if c.name == "benchmark" else c)
    return per_seed, agg.reset_index(drop=True)

