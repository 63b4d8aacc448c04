"""Figures; each writes the data it plots as CSV beside the PDF."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .io import atomic_path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, table: pd.DataFrame, pdf_path: str | Path, csv_path: str | Path, float_format: str | None = "%.6f") -> None:
    """Write the figure (PDF) and the data it plots (CSV) atomically, and close the figure."""
    fig.tight_layout()
    with atomic_path(pdf_path) as tmp:
        fig.savefig(tmp, format="pdf")
    _pyplot().close(fig)
    with atomic_path(csv_path) as tmp:
        table.to_csv(tmp, index=False, float_format=float_format)


def schedule_curves(schedules: dict[str, tuple[float, float, float]], points: int = 201) -> pd.DataFrame:
    """Weight w(r) of every schedule on a grid of normalized positions r in [0, 1]."""
    import torch

    from .losses import schedule_weight

    r = np.linspace(0.0, 1.0, points)
    data = {"r": r}
    for name, (w_min, tau, s) in schedules.items():
        data[name] = schedule_weight(torch.tensor(r, dtype=torch.float64), w_min=w_min, tau=tau, s=s).numpy()
    return pd.DataFrame(data)


def schedules_figure(schedules: dict[str, tuple[float, float, float]], pdf_path: str | Path, csv_path: str | Path) -> pd.DataFrame:
    """Figure 2: the PW-OPSD weight schedules with their (w_min, tau, s) knobs annotated."""
    plt = _pyplot()

    curves = schedule_curves(schedules)
    fig, axes = plt.subplots(1, len(schedules), figsize=(3.0 * len(schedules), 2.6), sharey=True)
    axes = np.atleast_1d(axes)
    for ax, (name, (w_min, tau, s)) in zip(axes, schedules.items()):
        ax.plot(curves["r"], curves[name], color="C0", lw=2)
        ax.axhline(w_min, color="C3", ls="--", lw=1)
        ax.axvline(tau, color="C2", ls=":", lw=1)
        ax.axvspan(max(0.0, tau - 2 * s), min(1.0, tau + 2 * s), color="C2", alpha=0.08)
        ax.annotate(f"$w_{{\\min}}={w_min:g}$", (0.98, w_min), xytext=(0, 4), textcoords="offset points", ha="right", fontsize=8, color="C3")
        ax.annotate(f"$\\tau={tau:g}$", (tau, 0.02), xytext=(3, 0), textcoords="offset points", fontsize=8, color="C2")
        ax.annotate(f"$s={s:g}$ (width)", (tau, 0.5), xytext=(3, 0), textcoords="offset points", fontsize=8, color="C2")
        ax.set_title(name.capitalize(), fontsize=10)
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
    for ax, col in zip(np.atleast_1d(axes), panels):
        for run, grp in data.groupby("run", sort=False):
            ax.plot(grp["step"], grp[col], label=run, lw=1.2)
        ax.set_title(col.replace("_", " "), fontsize=10)
        ax.set_xlabel("step")
    np.atleast_1d(axes)[0].legend(fontsize=7)
    cols = ["run", "step"] + panels
    save_figure(fig, data[cols], pdf_path, csv_path, float_format=None)
    return data[cols]


def _failure(scored: pd.DataFrame) -> pd.DataFrame:
    """Candidates with a continuous viability (gray ones included), failure = 1 - mean viability."""
    data = scored[scored["mean_viability"].notna()].copy()
    data["failure"] = 1.0 - data["mean_viability"]
    return data


def branch_auroc_figure(scored: pd.DataFrame, *, bins: int, schedule: dict | None, schedule_name: str,
                        pdf_path: str | Path, csv_path: str | Path) -> pd.DataFrame:
    """Figure 1. (A) failure rate of forced student-context continuations by quantile bins of the
    normalized position and of two entropy scores; (B) the empirical reliability (mean child
    viability) by normalized-position bin with the PW-OPSD schedule ``w(r)`` overlaid."""
    plt = _pyplot()

    from .branch_viability import binned_rates

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
    table = pd.concat(frames, ignore_index=True)[["panel", "series", "bin", "lo", "hi", "center", "n", "value"]]

    fig, (ax_a, ax_b) = plt.subplots(1, 2, figsize=(8.0, 3.0))
    for k, (series, part) in enumerate(table[table["panel"] == "A"].groupby("series", sort=False)):
        ax_a.plot(part["bin"] + 1, part["value"], marker="o", color=f"C{k}", label=series)
    ax_a.set_xlabel("quantile bin (low $\\rightarrow$ high)")
    ax_a.set_ylabel("failure rate of forced branches")
    ax_a.set_ylim(-0.02, 1.02)
    ax_a.set_title("(A) failure by position vs entropy", fontsize=10)
    b = table[table["panel"] == "B"]
    emp = b[b["series"].str.startswith("reliability")]
    ax_b.plot(emp["center"], emp["value"], marker="o", color="C0", label="empirical reliability")
    for x, y, n in zip(emp["center"], emp["value"], emp["n"]):
        if n:
            ax_b.annotate(f"n={int(n)}", (x, y), xytext=(0, 5), textcoords="offset points", ha="center", fontsize=7)
    sched = b[b["series"].str.startswith("schedule")]
    if len(sched):
        ax_b.plot(sched["center"], sched["value"], color="C3", ls="--", label=f"PW-OPSD {schedule_name.removeprefix('pwopsd_')} $w(r)$")
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
    for label, part in table.groupby("label"):
        axes[0].scatter(part["r_tilde"], part["mean_viability"], s=12, color=colors.get(label, "k"), label=label, alpha=0.8)
        axes[1].scatter(part["h_trunc"], part["mean_viability"], s=12, color=colors.get(label, "k"), label=label, alpha=0.8)
    for ax, xlabel in ((axes[0], "normalized position $\\widetilde r$"), (axes[1], "$h_{\\mathrm{trunc}}$ (nats)")):
        ax.axhline(labels["v_high"], color="C0", ls=":", lw=1)
        ax.axhline(labels["v_low"], color="C3", ls=":", lw=1)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("mean child viability")
        ax.set_ylim(-0.05, 1.05)
    edges = np.linspace(0, 1, 11)
    for label, part in table.groupby("label"):
        axes[2].hist(part["r_tilde"], bins=edges, histtype="step", lw=1.5, color=colors.get(label, "k"), label=label)
    axes[2].set_xlabel("normalized position $\\widetilde r$")
    axes[2].set_ylabel("candidates")
    for ax in axes:
        if table.empty:
            ax.text(0.5, 0.5, "no labelled candidates", transform=ax.transAxes, ha="center", color="0.4")
        elif ax is not axes[1]:
            ax.legend(fontsize=7)
    save_figure(fig, table, pdf_path, csv_path)
    return table
