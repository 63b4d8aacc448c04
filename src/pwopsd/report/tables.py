"""LaTeX tables in the paper's layouts, generated from the tidy aggregate metrics
(``results/metrics/summary.parquet``: model, checkpoint, benchmark, metric, mean, std, n_seeds).

* :func:`branch_auroc_table`: Table 1 (one row per score: residualized AUROC and its cluster-bootstrap
  interval in the orientation ``diagnostic.scores.orientation`` selects; bold = the largest AUROC).
* :func:`method_benchmark_table`: Tables 2 and 3 (rows: method x benchmark; columns Pass/Avg/Maj@N;
  mean ± std; bold = column best and anything within ``bold_within`` pp of it: 0.1 in Table 2,
  0 (the exact maximum) in Table 3, as the paper bolds them).
* :func:`cross_model_table`: Table 4 (rows: model x method; columns: Avg@N per benchmark and the
  equal-weight benchmark mean, the latter without ± std as in the paper; bold = within-model winner
  per column, within 0.1 pp).
* :func:`ablation_table`: Table 5 (rows: the 2x2 cells; one benchmark column; bold = column max).

Each follows the paper's LaTeX line by line (environment, spacing commands, rules, one
``\multirow`` line per group); ``tests/test_tables.py`` renders the paper's own numbers and compares
the rows with the paper's source.

Values that are missing render as ``--``. Nothing downstream parses LaTeX back.
"""

from __future__ import annotations

import math
from typing import Sequence

import pandas as pd

METRIC_HEADERS = {"pass": "Pass@{n}", "avg": "Avg@{n}", "maj": "Maj@{n}", "maj_string": "Maj-str@{n}", "format_rate": "Format"}


def latex_name(name: str) -> str:
    """A config name (model, method, benchmark) as LaTeX text: where no label is configured the
    tables print the name, and an underscore outside math mode stops LaTeX ("Missing $ inserted")."""
    return str(name).replace("_", r"\_")


def shown_name(labels: dict[str, str], name: str, default: str | None = None) -> str:
    """``name``'s configured label, else ``default``, else the name as LaTeX text."""
    return labels.get(name) or default or latex_name(name)


def cell(mean: float | None, std: float | None, bold: bool = False, digits: int = 2) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "--"
    body = f"{mean:.{digits}f}"
    if std is not None and not (isinstance(std, float) and math.isnan(std)):
        body += f" \\pm {std:.{digits}f}"
    return f"$\\mathbf{{{body}}}$" if bold else f"${body}$"


def bold_flags(values: Sequence[float | None], within: float = 0.1) -> list[bool]:
    """Bold the best (largest) value and every value within ``within`` of it (on unrounded means)."""
    present = [v for v in values if v is not None and not math.isnan(v)]
    if not present:
        return [False] * len(values)
    best = max(present)
    return [v is not None and not math.isnan(v) and best - v <= within + 1e-9 for v in values]


def lookup(summary: pd.DataFrame, model: str, checkpoint: str, benchmark: str, metric: str) -> tuple[float | None, float | None]:
    row = summary[(summary["model"] == model) & (summary["checkpoint"] == checkpoint)
                  & (summary["benchmark"] == benchmark) & (summary["metric"] == metric)]
    if row.empty:
        return None, None
    return float(row["mean"].iloc[0]), float(row["std"].iloc[0])


def across_seeds(summary: pd.DataFrame, model: str, rows: Sequence[tuple[str, str]]) -> str:
    """What a table's ± is taken across, for its ``(checkpoint, label)`` rows: "evaluation seeds",
    or, where a row pools a method's training runs (seed names ``<run>/<seed>``,
    :func:`pwopsd.evaluation.pipeline.pool_runs`), every (training run, evaluation seed) pair, said
    for the rows that do."""
    labels = dict(rows)
    mine = summary[(summary["model"] == model) & summary["checkpoint"].isin(list(labels))]
    seeds = mine["seeds"] if "seeds" in mine else [None] * len(mine)
    pooled = {c for c, names in zip(mine["checkpoint"], seeds) if names is not None and any("/" in str(x) for x in names)}
    if not pooled:
        return "evaluation seeds"
    if pooled == set(mine["checkpoint"]):
        return "training runs and evaluation seeds (every pair)"
    return f"evaluation seeds, and training runs too for {', '.join(labels[c] for c in labels if c in pooled)} (every pair)"


def _wrap(body: list[str], caption: str, label: str, colspec: str, *, resize: bool = False, width: str | None = None,
          preamble: Sequence[str] = (), vspace: str | None = None) -> str:
    """A ``table`` float in the paper's layout: ``preamble`` (spacing commands) after ``\small``;
    ``width`` makes it a ``tabular*`` stretched with ``\extracolsep{\fill}``; ``vspace`` after it."""
    lines = ["\\begin{table}[t]", "\\centering", "\\small", *preamble, f"\\caption{{{caption}}}", f"\\label{{{label}}}"]
    if resize:
        lines.append("\\resizebox{\\linewidth}{!}{%")
    env, spec = ("tabular*", f"{{{width}}}{{@{{\\extracolsep{{\\fill}}}}{colspec}@{{}}}}") if width else ("tabular", f"{{{colspec}}}")
    lines += [f"\\begin{{{env}}}{spec}", "\\toprule", *body, "\\bottomrule", f"\\end{{{env}}}" + ("%" if resize else "")]
    if resize:
        lines.append("}")
    if vspace:
        lines.append(f"\\vspace{{{vspace}}}")
    lines.append("\\end{table}")
    return "\n".join(lines) + "\n"


def method_benchmark_table(summary, *, model: str, rows: Sequence[tuple[str, str]], benchmarks: Sequence[tuple[str, str]],
                           metrics: Sequence[str] = ("pass", "avg", "maj"), n: int = 12, caption: str, label: str,
                           bold_within: float = 0.1, group_rule: str = "\\midrule", first_header: str = "Method",
                           preamble: Sequence[str] = ()) -> str:
    """Tables 2 and 3. ``rows``: (checkpoint, display label); ``benchmarks``: (name, display label)."""
    cols = {(b, m): [lookup(summary, model, ckpt, b, m) for ckpt, _ in rows] for b, _ in benchmarks for m in metrics}
    bold = {k: bold_flags([mean for mean, _ in v], bold_within) for k, v in cols.items()}
    header = " & ".join([first_header, "Benchmark"] + [METRIC_HEADERS[m].format(n=n) for m in metrics]) + " \\\\"
    body = [header, "\\midrule"]
    for i, (ckpt, name) in enumerate(rows):
        if i:
            body.append(group_rule)
        body.append(f"\\multirow{{{len(benchmarks)}}}{{*}}{{{name}}}")
        for b, blabel in benchmarks:
            cells = [cell(*cols[(b, m)][i], bold=bold[(b, m)][i]) for m in metrics]
            body.append(" & ".join(["", blabel] + cells) + " \\\\")
    return _wrap(body, caption, label, "ll" + "c" * len(metrics), preamble=preamble, vspace="-0.3cm")


def cross_model_table(summary, *, models: Sequence[tuple[str, str]], methods: Sequence[tuple[str, str]],
                      benchmarks: Sequence[tuple[str, str]], metric: str = "avg", n: int = 12, mean_label: str | None = None,
                      caption: str, label: str, bold_within: float = 0.1) -> str:
    """Table 4: rows model x method (``methods``: (checkpoint, label)), one cell a line as in the
    paper; the last column is the equal-weight benchmark mean, shown without its std (the paper)."""
    columns = list(benchmarks) + [("mean", mean_label or METRIC_HEADERS[metric].format(n=n))]
    header = " & ".join(["Model", "Method"] + [lbl for _, lbl in columns]) + " \\\\"
    body = [header, "\\midrule"]
    for i, (model, mlabel) in enumerate(models):
        if i:
            body.append(f"\\cmidrule(l){{2-{2 + len(columns)}}}")
        vals = {b: [lookup(summary, model, ckpt, b, metric) for ckpt, _ in methods] for b, _ in columns}
        bold = {b: bold_flags([mean for mean, _ in v], bold_within) for b, v in vals.items()}
        body.append(f"\\multirow{{{len(methods)}}}{{*}}{{{mlabel}}}")
        for j, (ckpt, name) in enumerate(methods):
            body.append(f"  & {name}")
            for k, (b, _) in enumerate(columns):
                mean, std = vals[b][j]
                end = " \\\\" if k == len(columns) - 1 else ""
                body.append(f"    & {cell(mean, None if b == 'mean' else std, bold=bold[b][j])}{end}")
    return _wrap(body, caption, label, "ll" + "c" * len(columns), resize=True,
                 preamble=["\\setlength{\\tabcolsep}{3.5pt}", "\\renewcommand{\\arraystretch}{1.05}"], vspace="-0.3cm")


def ablation_table(summary, *, model: str, cells: Sequence[tuple[str, str]], benchmark: tuple[str, str], metric: str = "avg",
                   n: int = 12, caption: str, label: str) -> str:
    """Table 5 (bold = the column maximum)."""
    vals = [lookup(summary, model, ckpt, benchmark[0], metric) for ckpt, _ in cells]
    bold = bold_flags([m for m, _ in vals], within=0.0)
    body = [f"Configuration & {benchmark[1]} \\\\", "\\midrule"]
    body += [f"{name} & {cell(*v, bold=b)} \\\\" for (_, name), v, b in zip(cells, vals, bold)]
    return _wrap(body, caption, label, "lc", width="0.95\\linewidth")


def _label(spec: dict, method: str) -> str:
    return spec["methods_config"].get(method, {}).get("label") or latex_name(method)


def render_table(summary, spec: dict, benchmarks: Sequence[str]) -> str:
    """The table described by a ``tables.<kind>`` config entry (as assembled by the workflow)."""
    bl = [(b, shown_name(spec["benchmark_labels"], b)) for b in benchmarks]
    n = spec.get("n", 12)
    kind = spec["kind"]
    if kind in ("main", "schedules", "baselines"):
        model = spec["model"]
        rows = [(m, _label(spec, m)) for m in spec["methods"]]
        mlabel = shown_name(spec["model_labels"], model)
        across = across_seeds(summary, model, rows)
        if kind in ("main", "baselines"):
            caption = (f"{mlabel} results. Entries report mean $\\pm$ standard deviation across {across}. "
                       "Bold marks the best value for each benchmark--metric column and any value within 0.1 pp of the leader.")
            if kind == "baselines":
                caption = ("Beyond the paper: token-level distillation objectives its related work discusses, trained "
                           "with the same rollouts, privileged teacher and budget. " + caption)
            return method_benchmark_table(summary, model=model, rows=rows, benchmarks=bl, n=n, caption=caption,
                                          label=f"tab:{kind}-4b", preamble=["\\setlength{\\tabcolsep}{4.5pt}"])
        caption = (f"Position-schedule sweep on {mlabel}. Mean $\\pm$ standard deviation across {across}; "
                   "bold marks the best value for each benchmark--metric column within the sweep.")
        return method_benchmark_table(summary, model=model, rows=rows, benchmarks=bl, n=n, caption=caption,
                                      label="tab:pwopsd-ablation", group_rule="\\cmidrule(l){2-5}", first_header="Config",
                                      bold_within=0.0)
    if kind == "cross_model":
        models = [(m, shown_name(spec["model_labels"], m)) for m in spec["models"]]
        caption = ("Cross-model Avg@" + str(n) + " of the methods. Entries report mean $\\pm$ across-seed sample standard "
                   "deviation; the Avg@" + str(n) + " column is the equal-weight mean across the benchmarks, computed from "
                   "unrounded seed-level values. Bold marks the within-model winner in each numeric column, including "
                   "values within 0.1 pp of the leader.")
        return cross_model_table(summary, models=models, methods=[(m, _label(spec, m)) for m in spec["methods"]],
                                 benchmarks=bl, n=n, caption=caption, label="tab:cross-model")
    if kind == "ablation":
        b = spec["benchmark"]
        caption = (f"$2\\times2$ ablation on {shown_name(spec['model_labels'], spec['model'])} "
                   f"{shown_name(spec['benchmark_labels'], b)}: reduction by positioning. Avg@{n} mean $\\pm$ sample standard "
                   f"deviation across {across_seeds(summary, spec['model'], [(c['method'], c['label']) for c in spec['cells']])}. "
                   "Bold marks the column maximum.")
        return ablation_table(summary, model=spec["model"], cells=[(c["method"], c["label"]) for c in spec["cells"]],
                              benchmark=(b, shown_name(spec["benchmark_labels"], b)), n=n, caption=caption,
                              label="tab:reduction-ablation")
    raise ValueError(f"unknown table kind {kind!r}")


def branch_auroc_table(summary: dict, *, model_label: str) -> str:
    """Table 1 from the Phase G summary (``branch_auroc.json``): one row per score with the
    within-problem residualized AUROC and its cluster-bootstrap interval; the pool's counts go in
    the caption. When the pool cannot give an AUROC (``status`` not ``ok``), the cells read
    ``n/a`` and the caption says why."""
    c = summary["counts"]
    level = round(100 * summary["settings"]["scores"]["level"])
    ok = summary["status"] == "ok"
    caption = (
        f"Branch-viability classification on {model_label}. Entries are within-problem residualized AUROC for "
        f"separating ${c['real_uncertain']}$ \\emph{{real-uncertain}} candidates (whose forced student-context "
        f"continuations fail to recover the correct answer) from ${c['diversity']}$ \\emph{{diversity}} candidates "
        f"(whose continuations remain viable) across ${c['problems_labelled']}$ problems"
        + (", restricted to the correct-spine subset" if summary["settings"]["scores"]["correct_spines_only"] else "")
        + " and to high-truncated-entropy candidate positions "
        f"(${c['correct_spines']}$ of ${c['problems']}$ spines correct; ${c['gray']}$ gray candidates excluded). "
        "For position, the scored feature is $1-\\widetilde r$, so larger values correspond to earlier tokens. "
        f"Cluster-bootstrap ${level}\\%$ CIs are computed over problems"
        + (" (folded: every AUROC and bootstrap draw is shown as $\\max(A, 1-A)$)." if summary.get("orientation") == "folded"
           else ".")
    )
    if not ok:
        caption += f" \\textbf{{Not computable: {summary['status']}.}}"
    aurocs = [row["auroc"] for row in summary["scores"]]
    flags = bold_flags([a if a is not None else float("nan") for a in aurocs], within=0.0)
    body = [f"score (residualized within problem) & residual AUROC & {level}\\% CI\\\\", "\\midrule"]
    for row, bold in zip(summary["scores"], flags):
        if row["auroc"] is None:
            # within a computable pool, a score missing or not finite at some candidates (n_missing)
            missing = f" ({row['n_missing']} missing)" if ok and row.get("n_missing") else ""
            body.append(f"{row['label']} & n/a{missing} & n/a\\\\")
            continue
        ci = "n/a" if row["ci_low"] is None else f"[{row['ci_low']:.2f}, {row['ci_high']:.2f}]"
        a = f"{row['auroc']:.2f}"
        if bold:
            a, ci = f"\\mathbf{{{a}}}", (f"\\mathbf{{{ci}}}" if ci != "n/a" else ci)
        body.append(f"{row['label']} & ${a}$ & ${ci}$\\\\" if ci != "n/a" else f"{row['label']} & ${a}$ & n/a\\\\")
    return _wrap(body, caption, "tab:branch-auroc", "lcc", width="0.95\\linewidth", vspace="-0.5cm")


def _signed(x: float, digits: int = 2) -> str:
    return f"${x:+.{digits}f}$"


def _run_variance_note(frame, method_labels: dict[str, str]) -> str:
    """The caption's warning for rows whose methods have one training run each: their interval and
    p hold no training-seed variance (one run cannot estimate it)."""
    single = frame[~frame["run_variance_included"].astype(bool)] if "run_variance_included" in frame else frame.iloc[:0]
    if single.empty:
        return ""
    which = "every row" if len(single) == len(frame) else "rows of " + ", ".join(
        shown_name(method_labels, m) for m in dict.fromkeys(single["method"]))
    return (f" In {which} each method has one training run: neither the interval nor $p$ includes training-seed "
            "variance (\\texttt{python -m pwopsd.power} tells how many runs a gain needs).")


def significance_table(frame, *, metric_labels: dict[str, str], method_labels: dict[str, str], model_labels: dict[str, str],
                       benchmark_labels: dict[str, str], level: float, n: int, label: str, alpha: float = 0.05) -> str:
    """Each method against the baseline (:func:`pwopsd.report.significance.significance_frame`): per
    metric a block of rows (model, method), per benchmark (and the mean column) Δ in points, its
    interval and the Holm-adjusted p; Δ in bold where that p is below ``alpha``."""
    benchmarks = list(dict.fromkeys(frame["benchmark"]))
    baseline = ", ".join(sorted({shown_name(method_labels, b) for b in frame["baseline"]}))
    models = list(dict.fromkeys(frame["model"]))
    body = ["Metric & Model & Method & " + " & ".join(shown_name(benchmark_labels, b, "Mean" if b == "mean" else None) for b in benchmarks)
            + " \\\\", "\\midrule"]
    for i, metric in enumerate(dict.fromkeys(frame["metric"])):
        if i:
            body.append("\\midrule")
        sub = frame[frame["metric"] == metric]
        for model in models:
            for method in dict.fromkeys(sub.loc[sub["model"] == model, "method"]):
                cells = []
                for b in benchmarks:
                    r = sub[(sub["model"] == model) & (sub["method"] == method) & (sub["benchmark"] == b)]
                    if r.empty:
                        cells.append("--")
                        continue
                    r = r.iloc[0]
                    delta = _signed(r["delta"])
                    delta = f"\\textbf{{{delta}}}" if r["p_holm"] < alpha else delta
                    cells.append(f"{delta} {{\\scriptsize [{r['low']:.2f}, {r['high']:.2f}] $p$={r['p_holm']:.2g}}}")
                body.append(f"{metric_labels.get(metric, metric)}@{n} & {shown_name(model_labels, model)} & "
                            f"{shown_name(method_labels, method)} & " + " & ".join(cells) + " \\\\")
    caption = (f"Each method minus {baseline}, in points, paired by problem: {int(level * 100)}\\% interval and "
               "two-sided $p$ of one mixed model (problems paired; a method's effect per problem and a training run's "
               "level random; Satterthwaite degrees of freedom), $p$ Holm-adjusted over each metric's comparisons; bold: "
               f"adjusted $p < {alpha}$." + _run_variance_note(frame, method_labels))
    return _wrap(body, caption, label, "lll" + "c" * len(benchmarks), resize=True)


def sweep_table(frame, *, method_labels: dict[str, str], level: float, n: int, label: str, metric: str = "avg",
                benchmark: str = "mean", alpha: float = 0.05) -> str:
    """The checkpoint sweep of one table (:func:`pwopsd.report.sweep.sweep_frame`): per method a row,
    per swept step the ``metric`` of the ``benchmark`` column (default the mean column) with the
    difference to the baseline (bold where its Holm-adjusted p is below ``alpha``), then the best
    step and whether the rank at the evaluation step holds at every step."""
    data = frame[(frame["metric"] == metric) & (frame["benchmark"] == benchmark)]
    steps = sorted(data["step"].unique())
    eval_step = int(data.loc[data["eval_step"].astype(bool), "step"].iloc[0])
    head = " & ".join(["Method"] + [f"step {s}" + ("$^{*}$" if s == eval_step else "") for s in steps]
                      + ["best step", "rank holds"]) + " \\\\"
    body = [head, "\\midrule"]
    for method in dict.fromkeys(data["method"]):
        rows = data[data["method"] == method].set_index("step")
        cells = []
        for s in steps:
            r = rows.loc[s]
            cell = f"{r['value']:.1f} ({int(r['rank'])})"
            if not pd.isna(r["delta"]):
                delta = _signed(r["delta"], 1)
                cell += " " + (f"\\textbf{{{delta}}}" if r["p_holm"] < alpha else delta)
            cells.append(cell)
        first = rows.iloc[0]
        cells += [str(int(first["best_step"])), "yes" if first["rank_holds"] else "no"]
        body.append(f"{shown_name(method_labels, method)} & " + " & ".join(cells) + " \\\\")
    baseline = shown_name(method_labels, data["baseline"].iloc[0])
    column = "the mean column" if benchmark == "mean" else benchmark
    seeds = data.groupby("eval_step")["eval_seeds"].min()
    fewer = (f" The swept steps are evaluated with {int(seeds[False])} eval seed{'s' if seeds[False] > 1 else ''} "
             f"(\\texttt{{evaluation.sweep\\_seeds}}), the evaluation step with {int(seeds[True])}."
             if False in seeds.index and seeds[False] != seeds[True] else "")
    caption = (f"Checkpoint sweep: {METRIC_HEADERS.get(metric, metric).format(n=n)} of {column} at each saved step "
               f"($^{{*}}$: the evaluation step of the tables), the method's rank among the table's methods in "
               f"parentheses, and the difference to {baseline} in points (bold: Holm-adjusted $p < {alpha}$ over every "
               f"step and method; {int(level * 100)}\\% intervals in the CSV); best step and whether the rank at the "
               "evaluation step holds at every step." + fewer + _run_variance_note(data.dropna(subset=["delta"]), method_labels))
    return _wrap(body, caption, label, "l" + "c" * (len(steps) + 2), resize=True)
