"""After a run: the plan checked against what it cost, and the cost model's assumptions corrected
from it.

A job's planned wall time is ``startup + work`` (pwopsd.cost.job_hours), its work inversely
proportional to a throughput assumption: decoding (``decode_tok_s_per_gpu_4b`` with
``stream_tok_s_4b``) for generation, spines and forced continuations, the forward pass
(``forward_tok_s_per_gpu_4b``) for teacher passes and MC dropout. The fit finds, by least squares
over the finished jobs, the start-up and one factor per kind such that

    spent = attempts x startup + factor[kind] x planned work

(``attempts``: the submissions that did the job's work, a first one and those resumed after a
notice or requeue by a rule that resumes; attempts that failed are waste, not the model's). The
least squares keeps every coefficient positive (:func:`nonnegative_lstsq`): a kind whose factor
would not be leaves its throughput as it is, and a run that fits no start-up gets
MIN_STARTUP_MIN. Training is fitted after
them, with the corrected throughputs, by ``train_step_scale``. The corrected assumptions are
written as a config overlay (``cluster.cost_assumptions``) that the cost plan, the retries and
the notice windows read.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from pwopsd import cost
from pwopsd.status.collect import JobStatus, Status

KINDS = {"decode": ("generate", "generate_sweep_step", "spines", "forced_continuation"),
         "forward": ("teacher_pass", "mc_dropout")}
THROUGHPUTS = {"decode": ("decode_tok_s_per_gpu_4b", "stream_tok_s_4b"), "forward": ("forward_tok_s_per_gpu_4b",)}


@dataclass
class Sample:
    job: JobStatus
    kind: str          # decode, forward or train
    attempts: int      # submissions that did its work
    spent_h: float     # their wall hours


def samples(status: Status) -> list[Sample]:
    """The finished GPU jobs the fit can use: priced, with measured attempts."""
    out = []
    for job in status.jobs:
        if job.state != "done" or not job.gpus or job.planned_gpu_hours is None or job.job is None:
            continue
        kind = "train" if job.rule == "train" else next((k for k, rules in KINDS.items() if job.rule in rules), None)
        if kind is None:
            continue
        # the attempts of its last making (an earlier run of the job, before its inputs changed, is not this one)
        last_made = max((i for i, a in enumerate(job.attempts[:-1]) if a.state == "COMPLETED"), default=-1)
        resumes = job.rule in cost.NOTICE_KINDS  # a requeued job of another rule starts again from nothing
        useful = [a for a in job.attempts[last_made + 1:] if a.seconds is not None and (a.state == "COMPLETED" or
                  resumes and (a.reason.startswith("stopped on notice") or a.state in ("REQUEUED", "PREEMPTED")))]
        if not useful or useful[-1].state != "COMPLETED":
            continue
        out.append(Sample(job, kind, len(useful), sum(a.seconds for a in useful) / 3600.0))
    return out


def work_hours(job: JobStatus, cfg: dict, a: dict) -> float:
    """A job's planned wall hours less its start-up."""
    return cost.job_hours(job.job, cfg, a) - a["startup_min"] / 60.0


def fit(status: Status, cfg: dict) -> tuple[dict, dict]:
    """Corrected assumptions (only those the run measured) and a report of the fit."""
    a = cost.assumptions(cfg)
    data = samples(status)
    kinds = [k for k in KINDS if any(s.kind == k for s in data)]
    gpu = [s for s in data if s.kind in kinds]
    new: dict[str, float] = {}
    report = {"jobs": len(data), "kinds": {k: sum(s.kind == k for s in data) for k in (*KINDS, "train")}}
    startup_h = a["startup_min"] / 60.0
    if gpu:
        x = np.array([[s.attempts] + [work_hours(s.job, cfg, a) if s.kind == k else 0.0 for k in kinds] for s in gpu])
        y = np.array([s.spent_h for s in gpu])
        coef = nonnegative_lstsq(x, y, keep=0)
        if coef[0] > 0:
            startup_h = float(coef[0])
        else:  # no start-up fits (nearly none at all): the least a job takes to start a process
            startup_h = MIN_STARTUP_MIN / 60.0
            coef = nonnegative_lstsq(x[:, 1:], y - x[:, 0] * startup_h, keep=None)
            coef = np.concatenate([[startup_h], coef])
        factors = {k: float(c) for k, c in zip(kinds, coef[1:]) if c > 0}  # a kind left at 0 keeps its throughput
        new["startup_min"] = startup_h * 60.0
        for k, f in factors.items():
            for name in THROUGHPUTS[k]:
                new[name] = a[name] / f
        report["factors"] = factors
    trained = [s for s in data if s.kind == "train"]
    if trained:
        a2 = {**a, **new}
        w = np.array([work_hours(s.job, cfg, a2) for s in trained])
        rest = np.array([s.spent_h - s.attempts * a2["startup_min"] / 60.0 for s in trained])
        k = float((rest * w).sum() / (w * w).sum()) if (w * w).sum() else 0.0
        if k > 0:
            new["train_step_scale"] = a["train_step_scale"] * k
            report.setdefault("factors", {})["train"] = k
    report["error_before"] = residual(data, cfg, a)
    report["error_after"] = residual(data, cfg, {**a, **new})
    return new, report


# The start-up written when the fit finds none (a process and its imports).
MIN_STARTUP_MIN = 0.1


def nonnegative_lstsq(x: np.ndarray, y: np.ndarray, keep: int | None) -> np.ndarray:
    """Least squares with every coefficient > 0 or left out (0), column ``keep`` always in: the best
    fit over the subsets of columns whose plain least squares is all positive (a few columns: every
    subset is tried). All zeros when none is."""
    cols = x.shape[1]
    best, best_err = np.zeros(cols), math.inf
    for mask in range(1, 2 ** cols):
        subset = [j for j in range(cols) if mask >> j & 1]
        if keep is not None and keep not in subset:
            continue
        coef, *_ = np.linalg.lstsq(x[:, subset], y, rcond=None)
        if np.linalg.matrix_rank(x[:, subset]) < len(subset) or not all(c > 0 for c in coef):
            continue
        err = float(((x[:, subset] @ coef - y) ** 2).sum())
        if err < best_err - 1e-15:
            best, best_err = np.zeros(cols), err
            best[subset] = coef
    return best


def residual(data: list[Sample], cfg: dict, a: dict) -> float:
    """Sum of |spent - planned| wall hours over the samples (planned: attempts x start-up + work)."""
    return float(sum(abs(s.spent_h - (s.attempts * a["startup_min"] / 60.0 + work_hours(s.job, cfg, a))) for s in data))


def overlay_text(new: dict, report: dict, status: Status) -> str:
    import yaml

    head = [f"# Cost assumptions fitted from the run in {status.directory}",
            f"# (python -m pwopsd.status --fit-overlay, {time.strftime('%Y-%m-%d %H:%M')}): {report['jobs']} finished GPU jobs, "
            + ", ".join(f"{k} {n}" for k, n in report["kinds"].items() if n) + ".",
            f"# |spent - planned| over them: {report['error_before']:.3f} h with the assumptions in force, "
            f"{report['error_after']:.3f} h with these.",
            "# Use: snakemake --configfile THIS_FILE ...   python -m pwopsd.cost --configfile THIS_FILE"]
    body = yaml.safe_dump({"cluster": {"cost_assumptions": {k: float(f"{v:.6g}") for k, v in sorted(new.items())}}},
                          sort_keys=False)
    return "\n".join(head) + "\n" + body


def plan_vs_spent(status: Status) -> list[dict]:
    """Per rule and model: planned and spent GPU-hours and job-seconds of the finished jobs."""
    return status.spend(done_only=True)
