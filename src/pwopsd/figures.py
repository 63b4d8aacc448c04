"""Figures; each writes the data it plots as CSV beside the PDF."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .io import atomic_path


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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig.tight_layout()
    with atomic_path(pdf_path) as tmp:
        fig.savefig(tmp, format="pdf")
    plt.close(fig)
    with atomic_path(csv_path) as tmp:
        curves.to_csv(tmp, index=False, float_format="%.6f")
    return curves


def training_curves(log_paths: dict[str, str | Path], pdf_path: str | Path, csv_path: str | Path) -> pd.DataFrame:
    """Per-step loss, KL, rollout length and rollout accuracy of one or more runs."""
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig.tight_layout()
    with atomic_path(pdf_path) as tmp:
        fig.savefig(tmp, format="pdf")
    plt.close(fig)
    cols = ["run", "step"] + panels
    with atomic_path(csv_path) as tmp:
        data[cols].to_csv(tmp, index=False)
    return data[cols]
