"""The reproduction report: the paper's published numbers (``workflow/reference/paper_results.csv``,
Tables 1-5, extracted once from the paper's LaTeX by ``tools/extract_paper_results.py``) beside the
reproduced ones, with the difference and whether it lies within the across-seed spread.

Agreement rules (docs/cluster.md, "Reading the reproduction report"):

* Tables 2-5 (percent, mean ± across-seed sample std over the evaluation seeds): a reproduced
  value agrees when ``|reproduced - paper| <= 2 * sqrt(s_paper^2 + s_reproduced^2)``; when the
  paper gives no std (the 4-benchmark mean of Table 4) only the reproduced std counts.
* Table 1 (residual AUROC with a 95% cluster-bootstrap CI): agreement when the two intervals
  overlap.

Rows whose run was not reproduced (e.g. tiny mode, where the models and benchmarks differ) show
the reproduced side only and say so.

Numbers are compared as the configuration produces them: the ``grading.verdicts`` grader's (the
reference grader in paper mode) and Table 1 in ``diagnostic.scores.orientation``. The other graders'
values (metrics ``avg/<grader>``, ...) and Table 1's other orientation (``residual_auroc/<orientation>``)
are shown beside each row, so a reader sees what the grader fixes change.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

KEY = ["paper_table", "model", "method", "benchmark", "metric"]


def load_reference(path: str | Path) -> pd.DataFrame:
    ref = pd.read_csv(path, dtype={"paper_table": str, "model": str, "method": str, "benchmark": str, "metric": str})
    missing = {"paper_table", "model", "method", "benchmark", "metric", "mean"} - set(ref.columns)
    if missing:
        raise ValueError(f"{path}: reference file lacks columns {sorted(missing)}")
    return ref


def reproduced_values(summary: pd.DataFrame, branch: dict | None, *, diagnostic_model: str | None) -> pd.DataFrame:
    """Reproduced numbers keyed like the reference: (model, method = checkpoint, benchmark, metric)."""
    rows = summary.rename(columns={"checkpoint": "method"})[["model", "method", "benchmark", "metric", "mean", "std",
                                                              "n_seeds"]].copy()
    rows["ci_low"], rows["ci_high"] = np.nan, np.nan
    if branch is not None and branch.get("status") == "ok":
        chosen = branch.get("orientation")
        extra = []
        for s in branch["scores"]:
            base = {"model": diagnostic_model, "method": s["score"], "benchmark": "branch_viability", "std": np.nan,
                    "n_seeds": np.nan}
            extra.append({**base, "metric": "residual_auroc", "mean": s["auroc"], "ci_low": s["ci_low"], "ci_high": s["ci_high"]})
            for o in ("raw", "folded"):
                if o != chosen and s.get(f"auroc_{o}") is not None:
                    extra.append({**base, "metric": f"residual_auroc/{o}", "mean": s[f"auroc_{o}"],
                                  "ci_low": s[f"ci_low_{o}"], "ci_high": s[f"ci_high_{o}"]})
        rows = pd.concat([rows, pd.DataFrame(extra)], ignore_index=True)
    return rows


def beside(reproduced: pd.DataFrame, model: str, method: str, benchmark: str, metric: str) -> str:
    """The same number from the other graders (``metric/<grader>``) or Table 1's other orientation,
    as ``name: value`` (empty when there is none)."""
    rows = reproduced[(reproduced["model"] == model) & (reproduced["method"] == method)
                      & (reproduced["benchmark"] == benchmark) & reproduced["metric"].str.startswith(metric + "/")]
    parts = []
    for _, r in rows.iterrows():
        parts.append(f"{r['metric'].split('/', 1)[1]}: {_value(r, metric)}")
    return "; ".join(parts)


def _agrees(r) -> bool | None:
    if pd.isna(r["reproduced"]):
        return None
    if r["metric"] == "residual_auroc":
        if any(pd.isna(r[c]) for c in ("ci_low", "ci_high", "repro_ci_low", "repro_ci_high")):
            return None
        return bool(r["repro_ci_low"] <= r["ci_high"] and r["ci_low"] <= r["repro_ci_high"])
    sp = 0.0 if pd.isna(r["std"]) else float(r["std"])
    sr = 0.0 if pd.isna(r["reproduced_std"]) else float(r["reproduced_std"])
    if sp == 0 and sr == 0:
        return bool(abs(r["difference"]) < 0.005)
    return bool(abs(r["difference"]) <= 2 * math.sqrt(sp**2 + sr**2) + 1e-9)


def compare(reference: pd.DataFrame, reproduced: pd.DataFrame) -> pd.DataFrame:
    """Every reference row with the reproduced mean/std (NaN when not reproduced), the
    difference and the agreement flag."""
    rep = reproduced.rename(columns={"mean": "reproduced", "std": "reproduced_std", "ci_low": "repro_ci_low",
                                     "ci_high": "repro_ci_high"})
    for col in ("repro_ci_low", "repro_ci_high"):
        if col not in rep:
            rep[col] = np.nan
    out = reference.merge(rep, on=["model", "method", "benchmark", "metric"], how="left")
    out["difference"] = out["reproduced"] - out["mean"]
    out["within_spread"] = [_agrees(r) for _, r in out.iterrows()]
    return out


def _fmt(mean, std=None, digits=2) -> str:
    if mean is None or pd.isna(mean):
        return "—"
    return f"{mean:.{digits}f}" + ("" if std is None or pd.isna(std) else f" ± {std:.{digits}f}")


def _value(r, metric: str) -> str:
    """A reproduced row's number as shown: AUROC [CI] for Table 1, mean ± std otherwise."""
    if metric == "residual_auroc":
        return f"{r['mean']:.2f} [{r['ci_low']:.2f}, {r['ci_high']:.2f}]"
    return _fmt(r["mean"], r["std"])


def render_markdown(comparison: pd.DataFrame, reproduced: pd.DataFrame, *, title_note: str) -> str:
    lines = ["# Reproduction report", "", title_note, ""]
    paired = comparison["reproduced"].notna()
    if paired.any():
        agree = comparison.loc[paired, "within_spread"]
        lines += [f"**{int(paired.sum())} of {len(comparison)} published numbers reproduced; "
                  f"{int((agree == True).sum())} agree within the across-seed spread "  # noqa: E712
                  f"(|Δ| ≤ 2·sqrt(s_paper² + s_repro²); Table 1: overlapping 95% CIs).**", ""]
        for table, part in comparison[paired].groupby("paper_table", sort=True):
            lines += [f"## {table}", "", "| model | method | benchmark | metric | paper | reproduced | Δ | within spread | beside |",
                      "|---|---|---|---|---|---|---|---|---|"]
            for _, r in part.iterrows():
                if r["metric"] == "residual_auroc":
                    paper = f"{r['mean']:.2f} [{r['ci_low']:.2f}, {r['ci_high']:.2f}]"
                    repro = f"{r['reproduced']:.2f} [{r['repro_ci_low']:.2f}, {r['repro_ci_high']:.2f}]"
                else:
                    paper, repro = _fmt(r["mean"], r["std"]), _fmt(r["reproduced"], r["reproduced_std"])
                flag = {True: "yes", False: "**no**", None: "n/a"}[r["within_spread"]]
                other = beside(reproduced, r["model"], r["method"], r["benchmark"], r["metric"])
                lines.append(f"| {r['model']} | {r['method']} | {r['benchmark']} | {r['metric']} | {paper} | {repro} | "
                             f"{r['difference']:+.2f} | {flag} | {other} |")
            lines.append("")
        missing = comparison[~paired]
        if len(missing):
            lines += [f"{len(missing)} published numbers have no reproduced counterpart yet "
                      f"({', '.join(sorted(missing['paper_table'].unique()))}).", ""]
    else:
        lines += ["**Reproduced numbers only**: none of the configured runs corresponds to a published one "
                  "(different models or benchmarks), so no paper number is placed beside them.", ""]
    lines += ["## Reproduced numbers", "", "| model | method | benchmark | metric | reproduced (mean ± std over seeds) | beside |",
              "|---|---|---|---|---|---|"]
    shown = reproduced[reproduced["metric"].isin(["avg", "pass", "maj", "residual_auroc"])]
    for _, r in shown.sort_values(["model", "method", "benchmark", "metric"]).iterrows():
        lines.append(f"| {r['model']} | {r['method']} | {r['benchmark']} | {r['metric']} | {_value(r, r['metric'])} | "
                     f"{beside(reproduced, r['model'], r['method'], r['benchmark'], r['metric'])} |")
    return "\n".join(lines) + "\n"


def comparison_figure(comparison: pd.DataFrame, reproduced: pd.DataFrame, pdf_path, csv_path) -> pd.DataFrame:
    """Paper vs reproduced Avg@N (error bars: across-seed std); with no paired values, the
    reproduced Avg@N per run and benchmark alone, labelled as such."""
    from pwopsd.report.figures import _pyplot, save_figure

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4.8, 4.2))
    pairs = comparison[(comparison["metric"] == "avg") & comparison["reproduced"].notna()]
    if len(pairs):
        table = pairs[KEY + ["mean", "std", "reproduced", "reproduced_std", "within_spread"]].reset_index(drop=True)
        for k, (t, part) in enumerate(table.groupby("paper_table")):
            ax.errorbar(part["mean"], part["reproduced"], xerr=part["std"].fillna(0), yerr=part["reproduced_std"].fillna(0),
                        fmt="o", ms=4, color=f"C{k}", label=t, alpha=0.8)
        lo = float(np.nanmin([table["mean"].min(), table["reproduced"].min()])) - 2
        hi = float(np.nanmax([table["mean"].max(), table["reproduced"].max()])) + 2
        ax.plot([lo, hi], [lo, hi], color="0.5", ls="--", lw=1)
        ax.set_xlabel("paper Avg@N (%)")
        ax.set_ylabel("reproduced Avg@N (%)")
        ax.set_title("paper vs reproduction", fontsize=10)
        ax.legend(fontsize=7)
    else:
        table = reproduced[(reproduced["metric"] == "avg") & (reproduced["benchmark"] != "mean")].reset_index(drop=True)
        table = table[["model", "method", "benchmark", "metric", "mean", "std"]]
        for k, (bench, part) in enumerate(table.groupby("benchmark")):
            ax.errorbar(np.arange(len(part)) + 0.15 * k, part["mean"], yerr=part["std"].fillna(0), fmt="o", ms=4,
                        color=f"C{k}", label=bench)
        methods = list(dict.fromkeys(table["method"]))
        ax.set_xticks(range(len(methods)), methods, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("reproduced Avg@N (%)")
        ax.set_title("reproduced side only (no published counterpart)", fontsize=9)
        ax.legend(fontsize=7)
    save_figure(fig, table, pdf_path, csv_path)
    return table


def delta_verdicts(reference: pd.DataFrame, significance: pd.DataFrame) -> pd.DataFrame:
    """Per published difference (a method minus the significance baseline on the same model,
    benchmark and metric, from the paper's numbers; a method first published in another table than
    the baseline is paired across tables): the reproduced Δ and interval (the significance tables'
    rows), whether that interval holds the paper's Δ and whether it excludes 0."""
    columns = ["model", "method", "baseline", "benchmark", "metric", "paper_tables", "paper_delta", "delta", "low", "high",
               "p_holm", "holds_paper_delta", "excludes_zero"]
    ref = reference[reference["metric"].isin(["avg", "maj", "pass"])]
    published = {}  # (model, benchmark, metric) -> method -> (value, table), the first table that gives it
    for _, r in ref.iterrows():
        published.setdefault((r["model"], r["benchmark"], r["metric"]), {}).setdefault(r["method"], (float(r["mean"]), r["paper_table"]))
    rows = []
    for _, s in significance.drop_duplicates(["model", "method", "baseline", "benchmark", "metric"]).iterrows():
        values = published.get((s["model"], s["benchmark"], s["metric"]), {})
        if s["method"] in values and s["baseline"] in values:
            (m, mt), (b, bt) = values[s["method"]], values[s["baseline"]]
            paper = m - b
            rows.append({"model": s["model"], "method": s["method"], "baseline": s["baseline"], "benchmark": s["benchmark"],
                         "metric": s["metric"], "paper_tables": mt if mt == bt else f"{mt} - {bt}", "paper_delta": paper,
                         "delta": s["delta"], "low": s["low"], "high": s["high"], "p_holm": s["p_holm"],
                         "holds_paper_delta": bool(s["low"] <= paper <= s["high"]), "excludes_zero": bool(s["low"] > 0 or s["high"] < 0)})
    return pd.DataFrame(rows, columns=columns)


def _difference_cells(r) -> str:
    """The first cells of a published difference's markdown row: which comparison it is."""
    return f"| {r['model']} | {r['method']} | {r['baseline']} | {r['benchmark']} | {r['metric']} |"


def render_delta_verdicts(verdicts: pd.DataFrame) -> str:
    """The reproduction report's section on published differences (markdown)."""
    lines = ["## Published differences against the baseline", ""]
    if verdicts.empty:
        return "\n".join(lines + ["No published difference corresponds to a configured comparison (other models or "
                                  "benchmarks); the significance tables give the reproduced ones.", ""]) + "\n"
    lines += [f"{int(verdicts['holds_paper_delta'].sum())} of {len(verdicts)} reproduced intervals hold the paper's "
              f"difference; {int(verdicts['excludes_zero'].sum())} exclude 0 (paired by problem, 95% interval of the "
              "significance tables' mixed model; docs/decisions.md, \"Beyond the paper: is a gain larger than the "
              "noise?\").", "",
              "| model | method | baseline | benchmark | metric | paper Δ | reproduced Δ [interval] | Holm p | holds paper Δ | excludes 0 |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in verdicts.iterrows():
        lines.append(f"{_difference_cells(r)} {r['paper_delta']:+.2f} "
                     f"| {r['delta']:+.2f} [{r['low']:.2f}, {r['high']:.2f}] | {r['p_holm']:.2g} | "
                     f"{'yes' if r['holds_paper_delta'] else '**no**'} | {'yes' if r['excludes_zero'] else 'no'} |")
    return "\n".join(lines + [""]) + "\n"


def render_sweep_agreement(agreement: pd.DataFrame, steps: list[int], eval_step: int) -> str:
    """The reproduction report's section on the checkpoint sweep (markdown): for each published
    difference, the swept steps at which the reproduced one has the paper's sign
    (:func:`pwopsd.report.sweep.sign_agreement`)."""
    lines = ["## Published differences across the checkpoint sweep", ""]
    if agreement.empty:
        return "\n".join(lines + [f"The sweep (steps {', '.join(map(str, steps))}) covers no published difference.", ""]) + "\n"
    every = agreement["other_sign_steps"].map(len) == 0
    lines += [f"Swept steps {', '.join(map(str, steps))} (the tables evaluate step {eval_step}): {int(every.sum())} of "
              f"{len(agreement)} published differences keep the paper's sign at every swept step.", "",
              "| model | method | baseline | benchmark | metric | paper Δ | same sign at steps | other sign at steps |",
              "|---|---|---|---|---|---|---|---|"]
    for _, r in agreement.iterrows():
        lines.append(f"{_difference_cells(r)} {r['paper_delta']:+.2f} | {', '.join(map(str, r['same_sign_steps'])) or '-'} | "
                     f"{', '.join(map(str, r['other_sign_steps'])) or '-'} |")
    return "\n".join(lines + [""]) + "\n"
