"""Generations -> graded samples -> per-problem and per-seed metrics (rule ``grade``), and the
seed aggregate (rule ``aggregate_metrics``)."""

from __future__ import annotations

import logging
import time
from typing import Any

import pandas as pd

from pwopsd.evaluation.grading import STATUS_OVER_BUDGET, STATUS_TIMEOUT, GraderPool, extract_boxed
from pwopsd.evaluation.metrics import METRICS, aggregate_seeds, clustering_pairs, maj_clusters, metrics_from_grades

log = logging.getLogger(__name__)


def grade_generations(generations: pd.DataFrame, benchmark: pd.DataFrame, pool: GraderPool,
                      maj_budget: float | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Grade every sample and compute every problem's metrics.

    Returns (graded samples, per-problem metrics). All gold comparisons are sent to the pool as one
    batch (identical pairs graded once); each problem's Maj@N clustering comparisons are one batch
    with a wall-clock budget of ``maj_budget`` seconds (``grading.maj_budget``; ``None``: no budget):
    a prediction with a comparison left ungraded when it runs out joins the INVALID cluster, so one
    problem of hostile outputs (N^2 grades of up to ``grading.timeout`` each) cannot stall the job.
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

    rows, labels, n_pairs = [], {}, 0
    for pid, grp in df.groupby("problem_id", sort=False):
        preds = [p if f else None for p, f in zip(grp["extracted"], grp["formatted"])]
        pairs = clustering_pairs(preds)
        eq = pool.grade_pairs([(ref, pred, False) for ref, pred in pairs], budget=maj_budget)
        n_pairs += len(pairs)
        table = {pair: g.correct for pair, g in zip(pairs, eq)}
        undecided = {p for pair, g in zip(pairs, eq) if g.status == STATUS_OVER_BUDGET for p in pair}
        if undecided:
            log.warning("problem %s: Maj@N clustering ran out of its %.0fs budget; %d of %d distinct predictions "
                        "join the INVALID cluster", pid, maj_budget, len(undecided), len(set(preds) - {None}))
        equivalent = lambda ref, pred, table=table: table.get((ref, pred), False)  # noqa: E731
        m = metrics_from_grades(preds, list(grp["correct"]), equivalent, undecided=undecided)
        lab, winner = maj_clusters([p is not None and p not in undecided for p in preds],
                                   lambda i, j: equivalent(preds[j], preds[i]))
        for idx, label in zip(grp.index, lab):
            labels[idx] = label
        rows.append({"problem_id": pid, "n": len(grp), "gold": gold[pid], "maj_winner": winner,
                     "maj_over_budget": len(undecided), **m})
    log.info("graded %d samples and %d clustering pairs in %.1fs (%s)", len(df), n_pairs, time.time() - t0, pool.stats)
    df["maj_cluster"] = pd.Series(labels)
    return df, pd.DataFrame(rows)


def seed_summary(problems: pd.DataFrame) -> dict[str, float]:
    """Benchmark-level metrics in percent (means over problems)."""
    return {m: float(100 * problems[m].mean()) for m in METRICS}


def grade_run(generations: pd.DataFrame, benchmark: pd.DataFrame, *, pool: GraderPool, meta: dict[str, Any],
              maj_budget: float | None = None) -> tuple[pd.DataFrame, dict]:
    graded, problems = grade_generations(generations, benchmark, pool, maj_budget)
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

