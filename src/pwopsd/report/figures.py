"""Figures (rules ``schedules_figure``, ``training_curves``, ``branch_auroc_figure``); each writes
the data it plots as CSV beside the PDF. Statistical panels are drawn with seaborn on one theme."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from pwopsd.io import atomic_path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(context="paper", style="whitegrid", palette="colorblind")
    return plt


def _sns():
    import seaborn as sns

    return sns


def save_figure(fig, table: pd.DataFrame, pdf_path: str | Path, csv_path: str | Path, float_format: str | None = "%.6f") -> None:
    """Write the figure (PDF) and the data it plots (CSV) atomically, and close the figure."""
    fig.tight_layout()
    with atomic_path(pdf_path) as tmp:
        fig.savefig(tmp, format="pdf")
    _pyplot().close(fig)
    with atomic_path(csv_path) as tmp:
        table.to_csv(tmp, index=False, float_format=float_format)


def schedule_curves(schedules: dict[str, tuple[float, float, float]], points: int = 201) -> pd.DataFrame:
    """Weight w(r) of every schedule on a grid of normalized positions r in [0, 1] (NumPy only:
    the figure rules run in the analysis environment, which has no torch)."""
    from pwopsd.schedule import schedule_weight

    r = np.linspace(0.0, 1.0, points)
    data = {"r": r}
    for name, (w_min, tau, s) in schedules.items():
        data[name] = schedule_weight(r, w_min=w_min, tau=tau, s=s)
    return pd.DataFrame(data)


def fitted_band(fitted: dict, points: int) -> tuple[np.ndarray, np.ndarray]:
    """The fitted schedule's pointwise bootstrap band (``fitted_schedule.json``) on a grid of
    ``points`` normalized positions."""
    c = fitted["curve"]
    grid = np.linspace(0.0, 1.0, points)
    return np.interp(grid, c["r"], c["low"]), np.interp(grid, c["r"], c["high"])


def schedules_figure(schedules: dict[str, tuple[float, float, float]], pdf_path: str | Path, csv_path: str | Path,
                     titles: dict[str, str] | None = None, fitted: dict[str, dict] | None = None) -> pd.DataFrame:
    """Figure 2: the PW-OPSD weight schedules with their (w_min, tau, s) knobs annotated; one
    panel per schedule, titled by ``titles`` (default the schedule's name), one CSV column each.
    A schedule fitted to the diagnostic (``fitted``: name -> ``fitted_schedule.json``) gets its
    bootstrap band (CSV columns ``<name>_low``/``<name>_high``) and the hand-picked curves in grey."""
    plt = _pyplot()

    curves = schedule_curves(schedules)
    for name, fit in (fitted or {}).items():
        curves[f"{name}_low"], curves[f"{name}_high"] = fitted_band(fit, len(curves))
    fig, axes = plt.subplots(1, len(schedules), figsize=(3.0 * len(schedules), 2.6), sharey=True)
    axes = np.atleast_1d(axes)
    for ax, (name, (w_min, tau, s)) in zip(axes, schedules.items()):
        if name in (fitted or {}):
            level = round(100 * fitted[name]["level"])
            ax.fill_between(curves["r"], curves[f"{name}_low"], curves[f"{name}_high"], color="C0", alpha=0.2,
                            lw=0, label=f"{level}% bootstrap band")
            for other in schedules:
                if other not in fitted:
                    ax.plot(curves["r"], curves[other], color="0.7", lw=0.8)
            ax.legend(fontsize=7, loc="center left")
        ax.plot(curves["r"], curves[name], color="C0", lw=2)
        ax.axhline(w_min, color="C3", ls="--", lw=1)
        ax.axvline(tau, color="C2", ls=":", lw=1)
        ax.axvspan(max(0.0, tau - 2 * s), min(1.0, tau + 2 * s), color="C2", alpha=0.08)
        ax.annotate(f"$w_{{\\min}}={w_min:.3g}$", (0.98, w_min), xytext=(0, 4), textcoords="offset points", ha="right", fontsize=8, color="C3")
        ax.annotate(f"$\\tau={tau:.3g}$", (tau, 0.02), xytext=(3, 0), textcoords="offset points", fontsize=8, color="C2")
        ax.annotate(f"$s={s:.3g}$ (width)", (tau, 0.5), xytext=(3, 0), textcoords="offset points", fontsize=8, color="C2")
        ax.set_title((titles or {}).get(name, name), fontsize=10)
        ax.set_xlabel("normalized position $r$")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.05)
    axes[0].set_ylabel("weight $w(r)$")
    save_figure(fig, curves, pdf_path, csv_path)
    return curves


def training_curves(log_paths: dict[str, str | Path], pdf_path: str | Path, csv_path: str | Path) -> pd.DataFrame:
    """Per-step loss, KL, rollout length and rollout accuracy of one or more runs."""
    import json

    plt = _pyplot()

    frames = []
    for run, path in log_paths.items():
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        frames.append(pd.DataFrame(rows).assign(run=run))
    data = pd.concat(frames, ignore_index=True)
    panels = [c for c in ("loss", "kl", "rollout_length", "rollout_accuracy") if c in data]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 2.6))
    for k, (ax, col) in enumerate(zip(np.atleast_1d(axes), panels)):
        # one line per run; runs logged more than once per step (several seeds) get a 95% band
        _sns().lineplot(data=data, x="step", y=col, hue="run", ax=ax, lw=1.2, errorbar=("ci", 95), legend=k == 0)
        ax.set_title(col.replace("_", " "), fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel("")
    if len(panels) and np.atleast_1d(axes)[0].get_legend() is not None:
        np.atleast_1d(axes)[0].legend(fontsize=7)
    cols = ["run", "step"] + panels
    save_figure(fig, data[cols], pdf_path, csv_path, float_format=None)
    return data[cols]


def _failure(scored: pd.DataFrame) -> pd.DataFrame:
    """Candidates with a continuous viability (gray ones included), failure = 1 - mean viability."""
    data = scored[scored["mean_viability"].notna()].copy()
    data["failure"] = 1.0 - data["mean_viability"]
    return data


def branch_auroc_figure(scored: pd.DataFrame, *, bins: int, schedule: dict | None, schedule_name: str, schedule_label: str | None = None,
                        pdf_path: str | Path, csv_path: str | Path, fitted: dict | None = None) -> pd.DataFrame:
    """Figure 1. (A) failure rate of forced student-context continuations by quantile bins of the
    normalized position and of two entropy scores; (B) the empirical reliability (mean child
    viability) by normalized-position bin with the PW-OPSD schedule ``w(r)`` overlaid and, when
    given, the schedule fitted to these outcomes (``fitted_schedule.json``): its weight ``w(r)``
    with the bootstrap band and its reliability ``v_max * w(r)``."""
    plt = _pyplot()

    from pwopsd.diagnostic.statistics import binned_rates

    data = _failure(scored)
    frames = []
    for series, column in (("position r", "r_tilde"), ("entropy h_trunc", "h_trunc"), ("entropy H_full", "h_full")):
        if column in data:
            ok = data[column].notna()
            part = binned_rates(data.loc[ok, column].to_numpy(), data.loc[ok, "failure"].to_numpy(), bins, quantile=True)
            frames.append(part.rename(columns={"failure_rate": "value"}).assign(panel="A", series=series))
    rel = binned_rates(data["r_tilde"].to_numpy(), data["failure"].to_numpy(), bins, quantile=False)
    rel["value"] = 1.0 - rel.pop("failure_rate")
    frames.append(rel.assign(panel="B", series="reliability (mean viability)"))
    if schedule is not None:
        curve = schedule_curves({schedule_name: (schedule["w_min"], schedule["tau"], schedule["s"])}, points=101)
        frames.append(pd.DataFrame({"panel": "B", "series": f"schedule {schedule_name}", "center": curve["r"],
                                    "value": curve[schedule_name]}))
    if fitted is not None:
        c = fitted["curve"]
        for series, values in (("fitted w(r)", c["w"]), ("fitted w(r) band low", c["low"]), ("fitted w(r) band high", c["high"]),
                               ("fitted reliability v_max w(r)", fitted["v_max"] * np.asarray(c["w"]))):
            frames.append(pd.DataFrame({"panel": "B", "series": series, "center": c["r"], "value": values}))
    table = pd.concat(frames, ignore_index=True)[["panel", "series", "bin", "lo", "hi", "center", "n", "value"]]

    fig, (ax_a, ax_b) = plt.subplots(1, 2, figsize=(8.0, 3.0))
    panel_a = table[table["panel"] == "A"].assign(quantile_bin=lambda t: t["bin"] + 1)
    if len(panel_a):
        _sns().lineplot(data=panel_a, x="quantile_bin", y="value", hue="series", marker="o", ax=ax_a)
    ax_a.set_xlabel("quantile bin (low $\\rightarrow$ high)")
    ax_a.set_ylabel("failure rate of forced branches")
    ax_a.set_ylim(-0.02, 1.02)
    ax_a.set_title("(A) failure by position vs entropy", fontsize=10)
    b = table[table["panel"] == "B"]
    emp = b[b["series"].str.startswith("reliability")]
    if emp["value"].notna().any():
        _sns().lineplot(x=emp["center"], y=emp["value"], marker="o", color="C0", label="empirical reliability", ax=ax_b)
    for x, y, n in zip(emp["center"], emp["value"], emp["n"]):
        if n:
            ax_b.annotate(f"n={int(n)}", (x, y), xytext=(0, 5), textcoords="offset points", ha="center", fontsize=7)
    sched = b[b["series"].str.startswith("schedule")]
    if len(sched):
        ax_b.plot(sched["center"], sched["value"], color="C3", ls="--", label=f"{schedule_label or schedule_name} $w(r)$")
    if fitted is not None:
        def series(name):
            return b[b["series"] == name]
        ax_b.fill_between(series("fitted w(r) band low")["center"], series("fitted w(r) band low")["value"],
                          series("fitted w(r) band high")["value"], color="C2", alpha=0.2, lw=0)
        p = fitted["params"]
        ax_b.plot(series("fitted w(r)")["center"], series("fitted w(r)")["value"], color="C2",
                  label=f"fitted $w(r)$ ({p['w_min']:.2f}, {p['tau']:.2f}, {p['s']:.2f})")
        ax_b.plot(series("fitted reliability v_max w(r)")["center"], series("fitted reliability v_max w(r)")["value"],
                  color="C2", ls=":", lw=1, label="fitted reliability $v_{\\max} w(r)$")
    ax_b.set_xlabel("normalized position $\\widetilde r$")
    ax_b.set_ylabel("reliability / weight")
    ax_b.set_xlim(0, 1)
    ax_b.set_ylim(-0.02, 1.05)
    ax_b.set_title("(B) reliability curve", fontsize=10)
    for ax in (ax_a, ax_b):
        ax.legend(fontsize=7, loc="lower right")
        if data.empty:
            ax.text(0.5, 0.5, "no labelled candidates", transform=ax.transAxes, ha="center", color="0.4")
    save_figure(fig, table, pdf_path, csv_path)
    return table


def branch_scatter_figure(scored: pd.DataFrame, *, labels: dict, pdf_path: str | Path, csv_path: str | Path) -> pd.DataFrame:
    """Per-candidate mean child viability against normalized position and truncated entropy, and
    histograms of the normalized position by label (the diagnostic's Phase G scatter/histograms)."""
    plt = _pyplot()

    data = _failure(scored)
    cols = ["dataset", "problem_id", "candidate", "position", "spine_length", "r_tilde", "h_trunc", "h_full",
            "mean_viability", "label"]
    table = data[[c for c in cols if c in data]].reset_index(drop=True)
    colors = {"real_uncertain": "C3", "diversity": "C0", "gray": "0.6"}
    fig, axes = plt.subplots(1, 3, figsize=(10.5, 3.0))
    sns = _sns()
    palette = {label: colors.get(label, "k") for label in table["label"].unique()} if "label" in table else {}
    if len(table):
        for ax, x in ((axes[0], "r_tilde"), (axes[1], "h_trunc")):
            sns.scatterplot(data=table, x=x, y="mean_viability", hue="label", palette=palette, s=14, alpha=0.8, ax=ax,
                            legend=ax is axes[0])
    for ax, xlabel in ((axes[0], "normalized position $\\widetilde r$"), (axes[1], "$h_{\\mathrm{trunc}}$ (nats)")):
        ax.axhline(labels["v_high"], color="C0", ls=":", lw=1)
        ax.axhline(labels["v_low"], color="C3", ls=":", lw=1)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("mean child viability")
        ax.set_ylim(-0.05, 1.05)
    edges = np.linspace(0, 1, 11)
    if len(table):
        sns.histplot(data=table, x="r_tilde", hue="label", palette=palette, bins=edges, element="step", fill=False,
                     lw=1.5, ax=axes[2])
    axes[2].set_xlabel("normalized position $\\widetilde r$")
    axes[2].set_ylabel("candidates")
    for ax in axes:
        if table.empty:
            ax.text(0.5, 0.5, "no labelled candidates", transform=ax.transAxes, ha="center", color="0.4")
        elif ax is axes[0] and ax.get_legend() is not None:
            ax.legend(fontsize=7)
    save_figure(fig, table, pdf_path, csv_path)
    return table


def deltas_figure(frame: pd.DataFrame, *, labels: dict[str, str], benchmark_labels: dict[str, str], pdf_path: str | Path,
                  csv_path: str | Path, metric: str = "avg") -> pd.DataFrame:
    """Forest plot of each method's difference to the baseline (``significance_frame`` rows of one
    metric): one panel per benchmark (and the mean column), Δ with its interval, 0 marked."""
    plt = _pyplot()
    data = frame[frame["metric"] == metric].copy()
    data["row"] = [f"{labels.get(me, me)} ({mo})" if data["model"].nunique() > 1 else labels.get(me, me)
                   for mo, me in zip(data["model"], data["method"])]
    benchmarks = list(dict.fromkeys(data["benchmark"]))
    rows = list(dict.fromkeys(data["row"]))
    fig, axes = plt.subplots(1, len(benchmarks), figsize=(2.6 * len(benchmarks) + 1.5, 0.45 * len(rows) + 1.2),
                             sharey=True, squeeze=False)
    for ax, bench in zip(axes[0], benchmarks):
        sub = data[data["benchmark"] == bench].set_index("row").reindex(rows)
        y = np.arange(len(rows))[::-1]
        significant = sub["p_holm"] < 0.05
        ax.errorbar(sub["delta"], y, xerr=[sub["delta"] - sub["low"], sub["high"] - sub["delta"]], fmt="none",
                    ecolor="0.4", capsize=2, lw=1)
        ax.scatter(sub["delta"][~significant], y[~significant.to_numpy()], color="0.4", zorder=3, s=18)
        ax.scatter(sub["delta"][significant], y[significant.to_numpy()], color="C3", zorder=3, s=22, label="Holm p < 0.05")
        ax.axvline(0.0, color="k", lw=0.8, ls="--")
        ax.set_title(benchmark_labels.get(bench, "Mean" if bench == "mean" else bench))
        ax.set_xlabel(f"Δ {metric} (points)")
        ax.set_yticks(y)
        ax.set_yticklabels(rows)
    baseline = ", ".join(sorted({labels.get(b, b) for b in data["baseline"]}))
    fig.suptitle(f"Difference to {baseline}, paired by problem")
    save_figure(fig, data.drop(columns=["row"]), pdf_path, csv_path)
    return data


def sweep_figure(frame: pd.DataFrame, *, labels: dict[str, str], pdf_path: str | Path, csv_path: str | Path,
                 metric: str = "avg", benchmark: str = "mean", base_value: float | None = None) -> pd.DataFrame:
    """The checkpoint sweep (:func:`pwopsd.report.sweep.sweep_frame`): ``metric`` of the
    ``benchmark`` column against the training step, one line per method with its interval, the
    evaluation step marked; ``base_value``: the base model's value, drawn at step 0."""
    plt = _pyplot()
    data = frame[(frame["metric"] == metric) & (frame["benchmark"] == benchmark)].sort_values(["method", "step"])
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    methods = list(dict.fromkeys(frame["method"]))
    for k, method in enumerate(methods):
        part = data[data["method"] == method]
        gap = np.diff(np.unique(data["step"])).min(initial=1) if data["step"].nunique() > 1 else 1
        x = part["step"].to_numpy() + (k - (len(methods) - 1) / 2) * 0.06 * gap  # side by side at each step
        ax.errorbar(x, part["value"], yerr=[part["value"] - part["low"], part["high"] - part["value"]], marker="o", ms=4,
                    capsize=2, lw=1.2, color=f"C{k}", label=labels.get(method, method))
    if base_value is not None:
        ax.axhline(base_value, color="0.5", lw=0.8, ls=":", label="base model")
    eval_step = int(data.loc[data["eval_step"].astype(bool), "step"].iloc[0])
    ax.axvline(eval_step, color="k", lw=0.8, ls="--")
    ax.set_xticks(sorted(data["step"].unique()))
    ax.set_xlabel("training step (dashed: the tables' evaluation step)")
    ax.set_ylabel(f"{metric.capitalize()} of the {'mean column' if benchmark == 'mean' else benchmark} (%)")
    ax.legend(fontsize=7, ncol=2)
    save_figure(fig, data, pdf_path, csv_path)
    return data
