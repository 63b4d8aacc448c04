"""Experiment tracking: real W&B (offline) and MLflow (local SQLite store) runs read back from their
stores; a resumed training run continues its tracked run without sending a step twice; a tracker
that fails (no login, server down, library missing) is one warning and the job goes on."""

import importlib.util
import json
import logging
import sys
import time

import pytest

from conftest import unavailable
from pwopsd.tracking import (TrackedRun, Tracker, diagnostic_run, evaluation_run, scalar_metrics, track_once,
                             training_run_name)
from tracker_stores import mlflow_runs, wandb_offline_runs

for _tracker in ("wandb", "mlflow"):  # found, not imported: MLflow's import takes 2 s (the tests that run it pay it)
    if importlib.util.find_spec(_tracker) is None:
        unavailable(f"{_tracker} is not installed", module=True)  # the tracking extra installs both


def settings(tmp_path, backend, **extra):
    return {"backend": backend, "project": "pwopsd-repro", "entity": None, "mode": "offline", "uri": None,
            "directory": str(tmp_path / "tracking"), "timeout_s": 120, **extra}  # W&B's offline finish is slow on a loaded 2-core CI


def stored(tmp_path, backend):
    directory = tmp_path / "tracking"
    return wandb_offline_runs(directory) if backend == "wandb" else mlflow_runs(directory)


def test_run_names_and_metrics():
    assert training_run_name("qwen3_4b", "pwopsd_moderate") == "qwen3_4b/pwopsd_moderate"
    assert training_run_name("qwen3_4b", "opsd-seed1") == "qwen3_4b/opsd/seed1"
    assert scalar_metrics({"loss": 1, "a": {"b": 2.5}, "nan": float("nan"), "flag": True, "name": "x"}) == {
        "loss": 1.0, "a/b": 2.5}
    summaries = [{"benchmark": "math500", "seed_name": s, "metrics_pct": {"avg": v, "pass": 2 * v}}
                 for s, v in (("main", 10.0), ("1", 20.0))]
    run, metrics = evaluation_run("qwen3_4b", "opsd-seed1", summaries, grading={})
    assert run.name == "qwen3_4b/opsd/seed1/eval" and run.group == "qwen3_4b/opsd/seed1" and run.job_type == "eval"
    assert metrics == {"math500/seed-main/avg": 10.0, "math500/seed-main/pass": 20.0, "math500/seed-1/avg": 20.0,
                       "math500/seed-1/pass": 40.0, "math500/avg": 15.0, "math500/pass": 30.0}
    one, _ = evaluation_run("qwen3_4b", "base", summaries[:1], grading={})
    assert one.name == "qwen3_4b/base/eval/seed-main" and one.run_id != run.run_id
    diag, values = diagnostic_run("qwen3_4b", {"scores": [{"score": "mi", "auroc": 0.7, "ci_low": 0.6, "ci_high": 0.8,
                                                            "auprc": 0.5}], "counts": {"candidates": 40}})
    assert diag.name == "qwen3_4b/diagnostic" and values == {"auroc/mi": 0.7, "ci_low/mi": 0.6, "ci_high/mi": 0.8,
                                                              "auprc/mi": 0.5, "counts/candidates": 40.0}


def test_tracking_off_writes_nothing(tmp_path):
    tracker = Tracker(settings(tmp_path, "none"), TrackedRun("m/opsd", "k", "m/opsd", "train"))
    assert not tracker.active and tracker.log({"loss": 1.0}, 1) is False
    track_once(settings(tmp_path, "none"), TrackedRun("m/diagnostic", "k", "m/diagnostic", "diagnostic"), {"a": 1})
    assert not (tmp_path / "tracking").exists()


@pytest.mark.parametrize("backend", ["wandb", "mlflow"])
def test_a_resumed_job_continues_its_tracked_run_without_repeating_steps(tmp_path, backend):
    """A job logs steps 1-5 and dies; its rerun, from the checkpoint of step 4, computes 5-8 again:
    the tracked run holds each of the steps 1-8 once, with the config and run key given."""
    run = TrackedRun("qwen3_4b/opsd", "abc123", "qwen3_4b/opsd", "train", config={"run_key": "abc123", "train": {"lr": 5e-6}})
    first = Tracker(settings(tmp_path, backend), run)
    assert first.active
    for step in range(1, 6):
        assert first.log({"loss": 1.0 / step, "kl": 0.1 * step, "note": "x"}, step)
    if backend == "wandb":
        first.close()  # Slurm's SIGTERM; MLflow's run stays open, as after a SIGKILL
    second = Tracker(settings(tmp_path, backend), run)
    sent = [second.log({"loss": 1.0 / step, "kl": 0.1 * step}, step) for step in range(5, 9)]
    second.close()
    assert sent == [False, True, True, True]
    # closed means written: W&B's service process has stopped (finish() alone returned while it was
    # still writing the last steps, and reading the run then lacked them about 1 time in 10). The service
    # is a direct child of the process that opened the run; descendants are not looked at, since in CI
    # the tiny run's jobs (tracked with W&B) run below this pytest process with services of their own
    if backend == "wandb":
        import psutil

        assert not [p.name() for p in psutil.Process().children(recursive=False) if p.name() == "wandb-core"]
    runs = stored(tmp_path, backend)
    assert list(runs) == [run.run_id]
    got = runs[run.run_id]
    assert got["name"] == "qwen3_4b/opsd"
    assert [s for s, _ in got["history"]] == list(range(1, 9))
    for step, values in got["history"]:
        assert values == pytest.approx({"loss": 1.0 / step, "kl": 0.1 * step}), step
    if backend == "mlflow":
        assert got["points"] == 16 and got["params"]["run_key"] == "abc123" and got["params"]["train.lr"] == "5e-06"
        assert got["status"] == "FINISHED"
    else:
        assert got["config"]["run_key"] == "abc123" and got["config"]["train"] == {"lr": 5e-6}
        assert got["group"] == "qwen3_4b/opsd" and got["job_type"] == "train"


def _one_warning(caplog, words):
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "pwopsd.tracking"]
    assert len(warnings) == 1 and all(w in warnings[0].getMessage() for w in words), [r.getMessage() for r in warnings]


def test_a_tracking_server_that_is_down_is_one_warning(tmp_path, caplog):
    """MLflow at a closed port: the job's tracker gives up within its timeout, logs once, goes on."""
    caplog.set_level(logging.WARNING)
    start = time.monotonic()
    tracker = Tracker(settings(tmp_path, "mlflow", uri="http://127.0.0.1:9", timeout_s=5), TrackedRun("m/opsd", "k", "m", "train"))
    assert not tracker.active
    assert [tracker.log({"loss": 1.0}, s) for s in (1, 2, 3)] == [False] * 3
    tracker.close()
    assert time.monotonic() - start < 60
    _one_warning(caplog, ["mlflow", "m/opsd", "tracking is off"])


def test_wandb_online_without_a_login_is_one_warning(tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.WARNING)
    for var in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))  # no stored login
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    tracker = Tracker(settings(tmp_path, "wandb", mode="online", timeout_s=10), TrackedRun("m/opsd", "k", "m", "train"))
    assert not tracker.active and tracker.log({"loss": 1.0}, 1) is False
    _one_warning(caplog, ["wandb", "m/opsd"])


def test_a_library_missing_from_the_jobs_environment_is_one_warning(tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.WARNING)
    monkeypatch.setitem(sys.modules, "wandb", None)  # what `import wandb` meets where it is not installed
    track_once(settings(tmp_path, "wandb"), TrackedRun("m/diagnostic", "k", "m", "diagnostic"), {"auroc/mi": 0.5})
    _one_warning(caplog, ["wandb", "ModuleNotFoundError"])


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["wandb", "mlflow"])
def test_a_killed_and_resumed_training_run_tracks_exactly_its_train_log(tmp_path, random_tiny_model, tiny_tokenizer, backend):
    """The trainer sends each step it logs; killed after step 3 (checkpoint at step 2) and resumed,
    the tracked steps and values are those of train_log.jsonl, each once (the redone step 3 is not
    sent again: its numbers are recomputed exactly, its timings are the first attempt's)."""
    from test_training import _trainer

    state = {k: v.clone() for k, v in random_tiny_model.state_dict().items()}

    def model():
        import copy

        m = copy.deepcopy(random_tiny_model)
        m.load_state_dict(state)
        return m

    work = tmp_path / "run"
    run = TrackedRun("tiny/opsd", work.name, "tiny/opsd", "train", config={"run_key": work.name})
    killed = _trainer(model, tiny_tokenizer, work)
    killed.tracker = Tracker(settings(tmp_path, backend), run)
    killed.train(stop_after=3)
    if backend == "wandb":
        killed.tracker.close()
        # W&B offline names a run's folder by the second it starts (offline-run-<date>_<HHMMSS>-<id>):
        # an attempt resumed within the same second would write into its predecessor's folder. A
        # job's restart takes seconds of imports, so in a workflow the attempts never share a second;
        # here the resume waits for the next one.
        time.sleep(1.05 - time.time() % 1)
    resumed = _trainer(model, tiny_tokenizer, work)
    resumed.tracker = Tracker(settings(tmp_path, backend), run)
    resumed.train()
    resumed.tracker.close()
    logged = [json.loads(x) for x in (work / "train_log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in logged] == [1, 2, 3, 4]
    history = stored(tmp_path, backend)[run.run_id]["history"]
    assert [s for s, _ in history] == [1, 2, 3, 4]
    clock = {"seconds", "rollout_seconds", "sync_seconds"}
    for (step, values), row in zip(history, logged):
        expected = {k: float(v) for k, v in row.items() if k != "step"}
        assert set(values) == set(expected), step
        # step 3, redone after the resume, keeps its first attempt's values: the same numbers but the timings
        same = {k for k in expected if step != 3 or k not in clock}
        assert {k: values[k] for k in same} == pytest.approx({k: expected[k] for k in same}, rel=1e-12), step


def test_a_tracker_that_cannot_finish_does_not_hold_the_job(tmp_path, caplog):
    """A run whose finish blocks (an upload that never ends): close returns after timeout_s with
    one warning."""
    import threading

    from pwopsd import tracking

    caplog.set_level(logging.WARNING)
    release = threading.Event()

    class Stuck:
        def __init__(self, settings, run):
            pass

        def log(self, metrics, step):
            pass

        def close(self):
            release.wait(60)

    tracking._BACKEND_RUNS["stuck"] = Stuck
    try:
        tracker = Tracker(settings(tmp_path, "stuck", timeout_s=1), TrackedRun("m/opsd", "k", "m", "train"))
        assert tracker.log({"loss": 1.0}, 1)
        start = time.monotonic()
        tracker.close()
        assert time.monotonic() - start < 10
    finally:
        release.set()
        del tracking._BACKEND_RUNS["stuck"]
    _one_warning(caplog, ["stuck", "did not finish within 1 s"])
