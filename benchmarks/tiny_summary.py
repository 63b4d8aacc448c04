"""What a finished tiny run shows, in one block: the build (kernel path, steps, dev accuracies),
Table 1 (pool, AUROCs) and the mean-column Avg@12 of each checkpoint (mean ± std over the seeds).

    python benchmarks/tiny_summary.py tiny            # or any tiny working directory

It reads result files only; docs/decisions.md ("Tiny mode: what the toy shows") lists these
figures per kernel path, to show which tiny numbers move between CPU kinds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd


def summary(workdir: Path) -> list[str]:
    res = workdir / "results"
    build = json.loads((res / "models/tiny_qwen3/build_report.json").read_text())
    acc = {fmt: round(100 * v["mean"], 1) for fmt, v in build["dev_accuracy"].items()}
    lines = [f"build: kernel path {build['cpu_capability']}, {build['pretraining_steps']} steps, "
             f"{build['seconds_total']:.0f} s; dev accuracy student / eval / teacher {acc['student']} / {acc['eval']} / {acc['teacher']}%"]
    diag = json.loads((res / "diagnostic/tiny_qwen3/branch_auroc.json").read_text())
    c = diag["counts"]
    lines.append(f"Table 1 pool: {c['correct_spines']} of {c['problems']} correct spines; real-uncertain {c['real_uncertain']} vs diversity {c['diversity']}")
    lines.append("Table 1 AUROC: " + ", ".join(f"{s['score']} {s['auroc']:.2f} [{s['ci_low']:.2f}, {s['ci_high']:.2f}]" for s in diag["scores"]))
    table = pd.read_csv(res / "metrics/summary.csv")
    # the tables' mean column: per seed the mean over benchmarks, then mean ± std over the seeds
    mean = table[(table["benchmark"] == "mean") & (table["metric"] == "avg")].set_index("checkpoint")
    if not mean.empty:
        lines.append("Avg@12 mean column: " + ", ".join(f"{ck} {r['mean']:.2f} ± {r['std']:.2f}" for ck, r in mean.iterrows()))
    return lines


if __name__ == "__main__":
    for line in summary(Path(sys.argv[1] if len(sys.argv) > 1 else "tiny")):
        print(line)
