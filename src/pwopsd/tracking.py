"""Experiment tracking (config section ``tracking``; off by default): training steps, evaluation
metrics and the diagnostic's AUROCs sent to Weights & Biases or MLflow while the workflow runs.

The tracker only watches: results are the workflow's files, never the tracker's. Every call into
a tracking library is guarded: the first failure (no login, network down, the library missing in
the job's environment) logs one warning naming the backend and the error, tracking is off for the
rest of the job, and the job goes on.

Runs. A training run is tracked as ``<model>/<method>`` (a further training seed N:
``<model>/<method>/seedN``) with the run's settings and run key as its config, and an id derived
from the run key: a job resumed after a kill reopens the same tracked run, a changed run (new run
key) is a new one. Evaluation and diagnostic jobs are tracked runs of their own in the training
run's group (``.../eval``, ``<model>/diagnostic``), with ids derived from their results.

Resumes. Each tracked run has a ledger, ``<directory>/ledger/<id>.json``, with the last step
sent. A resumed job sends only the steps after it: steps redone after the checkpoint are not sent
twice (the trainer recomputes them exactly; on GPUs the tracker keeps the first attempt's values).

The tracker's settings are read from ``snakemake.config`` on purpose, not from ``params``:
switching tracking on or off must not rerun any job.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from pwopsd.config import flat_items
from pwopsd.io import read_json, write_json

log = logging.getLogger(__name__)

BACKENDS = ("none", "wandb", "mlflow")


@dataclass(frozen=True)
class TrackedRun:
    name: str  # what the tracker shows: qwen3_4b/pwopsd_moderate/seed1
    key: Any  # what determines the run (JSON-able); its hash is the tracked run's id
    group: str  # the training run a job belongs to (W&B group, MLflow tag)
    job_type: str  # train | eval | diagnostic
    config: dict = field(default_factory=dict)

    @property
    def run_id(self) -> str:
        digest = hashlib.sha256(json.dumps([self.name, self.key], sort_keys=True, default=str).encode()).hexdigest()
        return digest[:24]


def training_run_name(model: str, run: str) -> str:
    """``<model>/<method>`` for a method's first training seed, ``<model>/<method>/seedN`` for a
    further seed (the run ``<method>-seedN``)."""
    from pwopsd.config import RUN_SEED

    method, sep, seed = run.partition(RUN_SEED)
    return f"{model}/{method}/seed{seed}" if sep else f"{model}/{method}"


def scalar_metrics(values: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The finite numbers of ``values`` (nested mappings flattened with ``/``), as floats."""
    return {key: float(value) for key, value in flat_items(values, "/", prefix)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)}


def flat_params(config: Mapping[str, Any]) -> dict[str, str]:
    """A run's config as MLflow parameters: ``section.key`` -> the value (JSON unless a string)."""
    return {key: value if isinstance(value, str) else json.dumps(value, default=str) for key, value in flat_items(config)}


def evaluation_run(model: str, checkpoint: str, summaries: list[dict], grading: dict) -> tuple[TrackedRun, dict]:
    """The tracked run of a grade job and its metrics: ``<benchmark>/seed-<s>/<metric>`` for each
    benchmark and evaluation seed of the job (``metrics_pct`` of the per-seed metrics files) and,
    with several seeds, ``<benchmark>/<metric>``, their mean. One job per seed is its own run
    (``.../eval/seed-<s>``)."""
    group = f"{model}/base" if checkpoint == "base" else training_run_name(model, checkpoint)
    seeds = list(dict.fromkeys(str(s["seed_name"]) for s in summaries))
    metrics: dict[str, float] = {}
    for s in summaries:
        metrics.update(scalar_metrics(s["metrics_pct"], f"{s['benchmark']}/seed-{s['seed_name']}/"))
    if len(seeds) > 1:
        for bench in dict.fromkeys(s["benchmark"] for s in summaries):
            rows = [scalar_metrics(s["metrics_pct"]) for s in summaries if s["benchmark"] == bench]
            for key in rows[0]:
                metrics[f"{bench}/{key}"] = sum(r[key] for r in rows) / len(rows)
    name = f"{group}/eval" + (f"/seed-{seeds[0]}" if len(seeds) == 1 else "")
    run = TrackedRun(name=name, key=metrics, group=group, job_type="eval",
                     config={"model": model, "checkpoint": checkpoint, "seeds": seeds, "grading": grading})
    return run, metrics


def diagnostic_run(model: str, summary: dict) -> tuple[TrackedRun, dict]:
    """The tracked run of the diagnostic's scores (Phase G) and its metrics: per score, the
    residualized AUROC with its interval and the AUPRC (``auroc/<score>``, ...), and the counts."""
    metrics: dict[str, float] = {}
    for row in summary.get("scores", []):
        for key in ("auroc", "ci_low", "ci_high", "auprc"):
            if isinstance(row.get(key), (int, float)):
                metrics[f"{key}/{row['score']}"] = float(row[key])
    metrics.update(scalar_metrics(summary.get("counts", {}), "counts/"))
    name = f"{model}/diagnostic"
    run = TrackedRun(name=name, key=metrics, group=name, job_type="diagnostic",
                     config={"model": model, "settings": summary.get("settings", {}), "status": summary.get("status")})
    return run, metrics


def track_once(settings: Mapping[str, Any] | None, run: TrackedRun, metrics: Mapping[str, Any], step: int = 0) -> None:
    """A job's results sent as one step of their own tracked run (nothing when tracking is off)."""
    if (settings or {}).get("backend", "none") == "none":
        return
    with Tracker(settings, run) as tracker:
        tracker.log(metrics, step)


# -- backends: open a run, log a step's metrics, close -------------------------------------------


class _WandbRun:
    def __init__(self, settings: dict, run: TrackedRun):
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        directory = Path(settings["directory"]).resolve()
        directory.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=settings["project"], entity=settings.get("entity"), name=run.name, id=run.run_id,
            resume="allow", group=run.group, job_type=run.job_type, config=run.config, dir=str(directory),
            mode=settings["mode"], reinit="create_new",
            settings=wandb.Settings(console="off", silent=True, init_timeout=settings["timeout_s"],
                                    x_disable_stats=True, save_code=False, disable_git=True))

    def log(self, metrics: dict, step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        # finish() returns before W&B's service has written the run's last records (the offline
        # file lacked its final steps when read right after it, about 1 time in 10 on a loaded
        # host); teardown waits for the service to write everything and stop. A job holds one
        # tracked run at a time, so no other run is cut short; a later run starts a new service.
        import wandb

        self.run.finish()
        wandb.teardown()


class _MlflowRun:
    TAG = "pwopsd.run_id"

    def __init__(self, settings: dict, run: TrackedRun):
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")  # a server that is down fails in seconds
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(settings["timeout_s"]))
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        directory = Path(settings["directory"]).resolve()
        uri = settings.get("uri")
        if not uri:
            directory.mkdir(parents=True, exist_ok=True)
            uri = f"sqlite:///{directory / 'mlflow.db'}"
        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(settings["project"])
        exp_id = exp.experiment_id if exp else self.client.create_experiment(
            settings["project"], artifact_location=None if settings.get("uri") else (directory / "mlflow-artifacts").as_uri())
        found = self.client.search_runs([exp_id], filter_string=f"tags.`{self.TAG}` = '{run.run_id}'", max_results=1)
        if found:
            self.run_id = found[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            tags = {self.TAG: run.run_id, "pwopsd.group": run.group, "pwopsd.job_type": run.job_type}
            self.run_id = self.client.create_run(exp_id, run_name=run.name, tags=tags).info.run_id
            params = [Param(k[:250], v[:6000]) for k, v in flat_params(run.config).items()]
            for start in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
                self.client.log_batch(self.run_id, params=params[start:start + 100])

    def log(self, metrics: dict, step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, int(step)) for k, v in metrics.items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


_BACKEND_RUNS = {"wandb": _WandbRun, "mlflow": _MlflowRun}


def _within(call, seconds: float) -> None:
    """Run ``call`` in a daemon thread; raise its error, or TimeoutError after ``seconds``."""
    import threading

    failure: list[BaseException] = []

    def target():
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            failure.append(exc)

    thread = threading.Thread(target=target, daemon=True, name="pwopsd-tracker-close")
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"the tracker did not finish within {seconds:g} s (tracking.timeout_s)")
    if failure:
        raise failure[0]


class Tracker:
    """One tracked run of a job, or nothing (``tracking.backend: none``). Never raises: the first
    failure of the library logs one warning and turns tracking off for this job."""

    def __init__(self, settings: Mapping[str, Any] | None, run: TrackedRun):
        self.settings = dict(settings or {"backend": "none"})
        self.backend = self.settings.get("backend", "none")
        self.run = run
        self._open = None
        self.ledger = Path(self.settings.get("directory", ".")) / "ledger" / f"{run.run_id}.json"
        self.last_step = -1
        if self.backend == "none":
            return
        if self.ledger.exists():
            self.last_step = int(read_json(self.ledger).get("last_step", -1))
        self._guard("start", lambda: setattr(self, "_open", _BACKEND_RUNS[self.backend](self.settings, run)))

    @property
    def active(self) -> bool:
        return self._open is not None

    def _guard(self, what: str, call) -> None:
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - the tracker never decides a result
            log.warning("tracking (%s) failed to %s run %s: %s: %s; tracking is off for the rest of this job",
                        self.backend, what, self.run.name, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
            self._open = None

    def log(self, metrics: Mapping[str, Any], step: int) -> bool:
        """Send a step's scalar metrics (non-finite values and non-numbers are left out); a step at
        or before the ledger's last one was sent already and is skipped. True when sent."""
        if self._open is None or step <= self.last_step:
            return False
        values = scalar_metrics(metrics)

        def send():
            self._open.log(values, int(step))
            self.last_step = int(step)
            write_json({"backend": self.backend, "name": self.run.name, "last_step": self.last_step}, self.ledger)

        self._guard("log to", send)
        return self._open is not None

    def close(self) -> None:
        """Finish the tracked run, waiting at most ``timeout_s`` (a tracker that cannot reach its
        server may wait for ever to upload): the job's own outputs never wait on it."""
        if self._open is not None:
            self._guard("close", lambda: _within(self._open.close, float(self.settings.get("timeout_s", 30))))
            self._open = None

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
