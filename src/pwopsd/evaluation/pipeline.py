"""Generations -> graded samples -> per-problem and per-seed metrics (rule ``grade``), and the
seed aggregate (rule ``aggregate_metrics``)."""

from __future__ import annotations

import logging
import shutil
import time
from typing import Any

import pandas as pd

from pwopsd.evaluation.grading import STATUS_CRASHED, STATUS_OVER_BUDGET, STATUS_TIMEOUT, GraderPool, GradingOptions, extract_boxed
from pwopsd.evaluation.metrics import METRICS, aggregate_seeds, clustering_pairs, maj_clusters, metrics_from_grades
from pwopsd.io import atomic_path, clear_partial, partial_dir, read_json, read_parquet, sha256_file, write_json, write_parquet
from pwopsd.keys import part_key
from pwopsd.notice import stop_on_notice

log = logging.getLogger(__name__)


def _grade_with(df: pd.DataFrame, gold: pd.Series, pool: GraderPool, options: GradingOptions,
                maj_budget: float | None) -> tuple[list, dict, pd.DataFrame]:
    """One grader's verdicts on the extracted samples of ``df``: (per-sample grades, Maj@N cluster
    label per row index, per-problem metrics)."""
    grades = pool.grade_pairs([(gold[pid], pred) for pid, pred in zip(df["problem_id"], df["extracted"])], options=options)
    correct = pd.Series([g.correct for g in grades], index=df.index)
    rows, labels = [], {}
    for pid, grp in df.groupby("problem_id", sort=False):
        preds = [p if f else None for p, f in zip(grp["extracted"], grp["formatted"])]
        pairs = clustering_pairs(preds)
        eq = pool.grade_pairs([(ref, pred, False) for ref, pred in pairs], budget=maj_budget, options=options)
        table = {pair: g.correct for pair, g in zip(pairs, eq)}
        undecided = {p for pair, g in zip(pairs, eq) if g.status == STATUS_OVER_BUDGET for p in pair}
        if undecided:
            log.warning("problem %s: Maj@N clustering ran out of its %.0fs budget; %d of %d distinct predictions "
                        "join the INVALID cluster", pid, maj_budget, len(undecided), len(set(preds) - {None}))
        equivalent = lambda ref, pred, table=table: table.get((ref, pred), False)  # noqa: E731
        m = metrics_from_grades(preds, list(correct[grp.index]), equivalent, undecided=undecided)
        lab, winner = maj_clusters([p is not None and p not in undecided for p in preds],
                                   lambda i, j: equivalent(preds[j], preds[i]))
        labels.update(zip(grp.index, lab))
        rows.append({"problem_id": pid, "n": len(grp), "gold": gold[pid], "maj_winner": winner,
                     "maj_over_budget": len(undecided), **m})
    return grades, labels, pd.DataFrame(rows)


def grade_generations(generations: pd.DataFrame, benchmark: pd.DataFrame, pool: GraderPool,
                      maj_budget: float | None = None, graders: dict[str, GradingOptions] | None = None,
                      verdicts: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, pd.DataFrame]]:
    """Grade every sample and compute every problem's metrics, with every grader in ``graders``
    (name -> options; default: the pool's options alone, named ``verdicts`` or "default").

    Returns (graded samples, per-problem metrics of the ``verdicts`` grader, per-problem metrics of
    every grader). The graded samples carry the ``verdicts`` grader's ``correct``/``grade_status``/
    ``maj_cluster`` and, per other grader, ``correct_<name>``. All gold comparisons of a grader go
    to the pool as one batch (identical pairs graded once); each problem's Maj@N clustering
    comparisons are one batch with a wall-clock budget of ``maj_budget`` seconds
    (``grading.maj_budget``; ``None``: no budget): a prediction with a comparison left ungraded when
    it runs out joins the INVALID cluster, so one problem of hostile outputs (N^2 grades of up to
    ``grading.timeout`` each) cannot stall the job.
    """
    verdicts = verdicts or "default"
    graders = graders or {verdicts: pool.options}
    if verdicts not in graders:
        raise ValueError(f"verdicts grader {verdicts!r} is not among the graders {sorted(graders)}")
    gold = benchmark.set_index("id")["answer"].astype(str)
    missing = set(generations["problem_id"]) - set(gold.index)
    if missing:
        raise ValueError(f"generations refer to problems not in the benchmark: {sorted(missing)[:5]}")
    df = generations.sort_values(["problem_id", "sample_index"], kind="stable").reset_index(drop=True)
    df["extracted"] = df["text"].map(extract_boxed)
    df["formatted"] = df["extracted"].notna()

    t0 = time.time()
    by_grader = {}
    for name in [verdicts] + [g for g in graders if g != verdicts]:
        grades, labels, problems = _grade_with(df, gold, pool, graders[name], maj_budget)
        by_grader[name] = problems
        if name == verdicts:
            df["correct"] = [g.correct for g in grades]
            df["grade_status"] = [g.status for g in grades]
            df["grade_seconds"] = [round(g.seconds, 6) for g in grades]
            df["maj_cluster"] = pd.Series(labels)
        else:
            df[f"correct_{name}"] = [g.correct for g in grades]
    log.info("graded %d samples with %d grader(s) in %.1fs (%s)", len(df), len(graders), time.time() - t0, pool.stats)
    return df, by_grader[verdicts], by_grader


def seed_summary(problems: pd.DataFrame) -> dict[str, float]:
    """Benchmark-level metrics in percent (means over problems)."""
    return {m: float(100 * problems[m].mean()) for m in METRICS}


def grade_run(generations: pd.DataFrame, benchmark: pd.DataFrame, *, pool: GraderPool, meta: dict[str, Any],
              maj_budget: float | None = None, graders: dict[str, GradingOptions] | None = None,
              verdicts: str | None = None) -> tuple[pd.DataFrame, dict]:
    """Graded samples and the metrics JSON of one benchmark: ``metrics_pct`` from the ``verdicts``
    grader (what the tables show), ``metrics_pct_by_grader`` for every grader."""
    graded, problems, by_grader = grade_generations(generations, benchmark, pool, maj_budget, graders, verdicts)
    summary = {
        **meta,
        "num_problems": int(len(problems)),
        "num_samples": int(len(graded)),
        "verdicts": verdicts or "default",
        "metrics_pct": seed_summary(problems),
        "metrics_pct_by_grader": {name: seed_summary(p) for name, p in by_grader.items()},
        # this pair's own counts (the pool's running totals, which depend on what it graded before, go to the log)
        "grading": {"timeouts": int((graded["grade_status"] == STATUS_TIMEOUT).sum()),
                    "crashes": int((graded["grade_status"] == STATUS_CRASHED).sum()),
                    "maj_over_budget": int(problems["maj_over_budget"].sum())},
        "problems": problems.to_dict(orient="records"),
    }
    return graded, summary


def grade_checkpoint(pairs: list[tuple[str, str, str, str, str]], benchmark_tables: dict[str, str], *, pool: GraderPool,
                     meta: dict[str, Any], maj_budget: float | None = None, graders: dict[str, GradingOptions] | None = None,
                     verdicts: str | None = None, notice=None) -> list[dict]:
    """Rule ``grade``: grade each ``(benchmark, seed_name, generations, graded_out, metrics_out)``
    of ``pairs`` and write its graded samples and metrics; returns the metrics summaries.

    Resumable, one benchmark-seed pair a shard: a graded pair is saved under its hidden partial
    folder (:func:`pwopsd.io.partial_dir`, keyed by the sha256 of its generations and benchmark
    files, ``meta`` (grading options), the grading settings, library versions and the grading
    code, :func:`pwopsd.keys.part_key`), which a rerun reuses; Snakemake
    deletes every output of a job that stops early, so every saved pair is kept until the last
    output is written. With a ``notice`` (:class:`pwopsd.notice.Notice`) that has
    received its signal, the job stops with ``Interrupted`` before the next pair."""
    summaries = []
    for i, (name, seed_name, generations, graded_out, metrics_out) in enumerate(pairs):
        pair_meta = {**meta, "benchmark": name, "seed_name": seed_name}
        saved = partial_dir(graded_out, part_key(
            None, code=("pwopsd.evaluation.pipeline",), generations=sha256_file(generations),
            benchmark=sha256_file(benchmark_tables[name]), meta={k: v for k, v in pair_meta.items() if k != "versions"},
            maj_budget=maj_budget, graders=graders,
            verdicts=verdicts), part="pair")
        if (saved / "metrics.json").exists():
            log.info("%s: graded before this attempt, reusing %s", metrics_out, saved)
        else:
            stop_on_notice(notice, f"{i} of {len(pairs)} benchmark-seed pairs graded and kept")
            graded, summary = grade_run(read_parquet(generations), read_parquet(benchmark_tables[name]), pool=pool,
                                        meta=pair_meta, maj_budget=maj_budget, graders=graders, verdicts=verdicts)
            write_parquet(graded, saved / "graded.parquet", metadata=pair_meta)
            write_json(summary, saved / "metrics.json")  # last: its presence says the pair is complete
        with atomic_path(graded_out) as tmp:
            shutil.copyfile(saved / "graded.parquet", tmp)
        with atomic_path(metrics_out) as tmp:
            shutil.copyfile(saved / "metrics.json", tmp)
        summaries.append(read_json(metrics_out))
        log.info("%s: %s", metrics_out, summaries[-1]["metrics_pct"])
    for pair in pairs:
        clear_partial(pair[3])
    return summaries


def seed_table(summaries: list[dict]) -> pd.DataFrame:
    """Tidy per-seed rows ``model, checkpoint, benchmark, seed, metric, value`` from metric JSONs.

    The ``verdicts`` grader's metrics keep their names (``avg``, ``pass``, ...); every other
    grader's carry its name after a slash (``avg/corrected``), so tables read the former and the
    reproduction report shows both."""
    rows = []
    for s in summaries:
        metrics = dict(s["metrics_pct"])
        for grader, values in s.get("metrics_pct_by_grader", {}).items():
            if grader != s.get("verdicts"):
                metrics.update({f"{m}/{grader}": v for m, v in values.items()})
        for metric, value in metrics.items():
            rows.append({"model": s["model"], "checkpoint": s["checkpoint"], "benchmark": s["benchmark"],
                         "seed": s["seed_name"], "metric": metric, "value": value})
    return pd.DataFrame(rows)


def pool_runs(summaries: list[dict]) -> list[dict]:
    """Per-seed metrics of a method's training runs as one checkpoint: a further seed's run
    (``<method>-seedN``, :func:`pwopsd.config.method_runs`) is relabeled to its method and its eval
    seeds to ``<run>/<seed>``, so a method's row is the mean ± std over every (training seed, eval
    seed) pair. With one run per method (the paper's config) nothing changes."""
    from pwopsd.config import run_method

    out = []
    for s in summaries:
        method = run_method(s["checkpoint"])
        out.append(s if method == s["checkpoint"] else {**s, "checkpoint": method, "seed_name": f"{s['checkpoint']}/{s['seed_name']}"})
    return out


def aggregate(summaries: list[dict], benchmarks: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-seed table, aggregate over seeds with the equal-weight benchmark mean); a method's
    training runs are pooled (:func:`pool_runs`)."""
    per_seed = seed_table(pool_runs(summaries))
    agg = aggregate_seeds(per_seed, benchmarks_for_mean=benchmarks)
    order = {b: i for i, b in enumerate(list(benchmarks) + ["mean"])}
    agg = agg.sort_values(["model", "checkpoint", "metric", "benchmark"], key=lambda c: c.map(order) if c.name == "benchmark" else c)
    return per_seed, agg.reset_index(drop=True)

