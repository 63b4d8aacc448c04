"""Beyond the paper: is the evaluation step representative? A checkpoint sweep of a table's methods.

The paper evaluates every method at one checkpoint (``training.eval_step``, step 100 of 150). With
``evaluation.sweep_steps`` the workflow also evaluates each run of a table at other saved steps
(the checkpoint ``<run>-step<N>``, :func:`pwopsd.config.step_checkpoint`); this module turns their
per-seed metrics into the sweep's numbers:

- per (method, step, metric, benchmark or the mean column): the value (the table cell at that
  step, in points) with its interval (:func:`pwopsd.report.significance.compare_strata` with no
  baseline), and the method's rank among the table's methods (1: best);
- per (method, step, ...) for every method but the baseline: its difference to the baseline at
  the same step, interval and p from the significance tables' mixed model, Holm-adjusted over
  every row of the sweep with the same metric (one family per table and metric);
- per (method, metric, benchmark): the best step, the rank at the evaluation step and whether that
  rank holds at every swept step.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from pwopsd.config.design import step_checkpoint
from pwopsd.report.significance import compare_strata, holm, run_scores, significance_frame


def runs_at_step(runs: dict[str, Sequence[str]], step: int, eval_step: int) -> dict[str, list[str]]:
    """Each method's checkpoints at ``step``: its runs themselves at the evaluation step, else each
    run's ``<run>-step<N>`` checkpoint."""
    return {m: [r if step == eval_step else step_checkpoint(r, step) for r in rs] for m, rs in runs.items()}


def sweep_deltas(summaries: Sequence[dict], comparisons: Sequence[tuple[str, str, str]], benchmarks: Sequence[str],
                 metrics: Sequence[str], runs: dict[str, Sequence[str]], steps: Sequence[int], eval_step: int,
                 *, level: float = 0.95) -> pd.DataFrame:
    """The significance frame (:func:`~pwopsd.report.significance.significance_frame`) of every
    swept step, with a ``step`` column; ``p_holm`` over every row of the same metric."""
    frames = []
    for step in steps:
        frame = significance_frame(summaries, comparisons, benchmarks, metrics, runs=runs_at_step(runs, step, eval_step),
                                   level=level)
        frames.append(frame.assign(step=int(step)))
    out = pd.concat(frames, ignore_index=True)
    for _, idx in out.groupby("metric").groups.items():
        out.loc[idx, "p_holm"] = holm(out.loc[idx, "p"].to_numpy())
    return out


def sweep_values(summaries: Sequence[dict], methods: Sequence[tuple[str, str]], benchmarks: Sequence[str],
                 metrics: Sequence[str], runs: dict[str, Sequence[str]], steps: Sequence[int], eval_step: int,
                 *, level: float = 0.95, mean_name: str = "mean") -> pd.DataFrame:
    """Per (model, method, metric, benchmark or the mean column, step): the value in points with its
    interval, and the method's rank among ``methods`` at that step (1: the highest value)."""
    rows = []
    for step in steps:
        at_step = runs_at_step(runs, step, eval_step)
        for metric in metrics:
            for model, method in methods:
                strata = [(run_scores(summaries, model, at_step.get(method, [method]), b, metric), None) for b in benchmarks]
                parts = [(b, [st]) for b, st in zip(benchmarks, strata)] + ([(mean_name, strata)] if len(strata) > 1 else [])
                for bench, group in parts:
                    c = compare_strata(group, level=level)
                    rows.append({"model": model, "method": method, "metric": metric, "benchmark": bench, "step": int(step),
                                 "value": c.delta, "low": c.low, "high": c.high, "runs": c.method_runs,
                                 "eval_seeds": c.eval_seeds,
                                 "eval_step": int(step) == int(eval_step)})
    frame = pd.DataFrame(rows)
    # ranked on values rounded to TIE_DECIMALS: two methods of equal scores (a mean of the same
    # fractions summed in another order) part in the last bit and would not share their rank
    frame["rank"] = (frame["value"].round(TIE_DECIMALS).groupby([frame[k] for k in ("model", "metric", "benchmark", "step")])
                     .rank(ascending=False, method="min").astype(int))
    return frame


TIE_DECIMALS = 9  # percentage points: far below any value shown


def rank_stability(values: pd.DataFrame) -> pd.DataFrame:
    """Per (model, method, metric, benchmark): the best step (the first of equal values), the rank
    at the evaluation step and whether that rank is the rank at every swept step."""
    rows = []
    for key, part in values.groupby(["model", "method", "metric", "benchmark"], sort=False):
        part = part.sort_values("step")
        at_eval = part.loc[part["eval_step"], "rank"]
        rank = int(at_eval.iloc[0]) if len(at_eval) else None
        rows.append(dict(zip(["model", "method", "metric", "benchmark"], key),
                         best_step=int(part.loc[part["value"].round(TIE_DECIMALS).idxmax(), "step"]), rank_at_eval_step=rank,
                         rank_holds=bool(rank is not None and (part["rank"] == rank).all())))
    return pd.DataFrame(rows)


def sweep_frame(summaries: Sequence[dict], comparisons: Sequence[tuple[str, str, str]], benchmarks: Sequence[str],
                metrics: Sequence[str], runs: dict[str, Sequence[str]], steps: Sequence[int], eval_step: int,
                *, level: float = 0.95) -> pd.DataFrame:
    """One row per (model, method, metric, benchmark or mean, step): value and interval, rank,
    difference to the baseline (empty on the baseline's rows) with interval, p and Holm's p, and
    the method's best step, rank at the evaluation step and whether it holds at every step."""
    methods = list(dict.fromkeys([(mo, base) for mo, _, base in comparisons] + [(mo, me) for mo, me, _ in comparisons]))
    values = sweep_values(summaries, methods, benchmarks, metrics, runs, steps, eval_step, level=level)
    deltas = sweep_deltas(summaries, comparisons, benchmarks, metrics, runs, steps, eval_step, level=level)
    keys = ["model", "method", "metric", "benchmark", "step"]
    deltas = deltas.rename(columns={"low": "delta_low", "high": "delta_high"})
    frame = values.merge(deltas[keys + ["baseline", "delta", "delta_low", "delta_high", "p", "p_holm", "df",
                                        "run_variance_included"]], on=keys, how="left")
    frame["baseline"] = frame["baseline"].fillna(comparisons[0][2] if comparisons else "")
    return frame.merge(rank_stability(values), on=["model", "method", "metric", "benchmark"], how="left")


def sign_agreement(verdicts: pd.DataFrame, sweep: pd.DataFrame) -> pd.DataFrame:
    """For each published difference (rows of :func:`pwopsd.report.reproduction.delta_verdicts`):
    the swept steps at which the reproduced difference has the paper's sign, and those at which it
    does not."""
    rows = []
    keys = ["model", "method", "baseline", "benchmark", "metric"]
    for _, v in verdicts.iterrows():
        part = sweep[np.logical_and.reduce([sweep[k] == v[k] for k in keys])].dropna(subset=["delta"]).sort_values("step")
        if part.empty:
            continue
        same = np.sign(part["delta"]) == np.sign(v["paper_delta"])
        rows.append({**{k: v[k] for k in keys}, "paper_delta": v["paper_delta"],
                     "same_sign_steps": [int(s) for s in part.loc[same, "step"]],
                     "other_sign_steps": [int(s) for s in part.loc[~same, "step"]]})
    return pd.DataFrame(rows, columns=keys + ["paper_delta", "same_sign_steps", "other_sign_steps"])
