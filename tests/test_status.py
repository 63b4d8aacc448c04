"""The status view of a run (pwopsd.status) and its source, the pwopsd logger plugin.

The plugin is tested on a real Snakemake run; the status of whole runs in the tests that run
them: the tiny run here, the Slurm runs in tests/test_slurm.py."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pwopsd import cost
from pwopsd.config import load_config_files
from pwopsd.status import events as ev
from pwopsd.status import fit as fitmod
from pwopsd.status.collect import Attempt, JobStatus, Status
from pwopsd.status.plan import file_closure

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]

TOY = """
rule all:
    input: expand("out/{name}/{kind}.txt", name=["ok", "flaky", "bad"], kind=["a"])

rule make:
    output: "out/{name}/{kind}.txt"
    log: "logs/{name}-{kind}.log"
    benchmark: "bench/{name}-{kind}.tsv"
    shell:
        "echo start {wildcards.name} > {log}; "
        "if [ {wildcards.name} = bad ] || {{ [ {wildcards.name} = flaky ] && [ ! -e flaky.once ]; }}; then "
        "touch flaky.once; echo 'boom: {wildcards.name} failed' >> {log}; exit 3; fi; "
        "sleep 1; echo {wildcards.name} > {output}"
"""


@pytest.mark.long
def test_the_logger_plugin_records_every_attempt_of_a_real_run(tmp_path):
    """A real Snakemake run with --logger pwopsd: a job that fails once and succeeds on retry, one
    that fails on every attempt (with its log's last lines), one that succeeds, each keyed by its
    wildcards in the rule's order (name, kind: the Slurm comment's); a dry run and a run with
    nothing to do leave no event file."""
    (tmp_path / "Snakefile").write_text(TOY)
    run = lambda *extra: subprocess.run([*SNAKEMAKE, "-c1", "--logger", "pwopsd", *extra], cwd=tmp_path,  # noqa: E731
                                        capture_output=True, text=True)
    run("-n")
    assert not (tmp_path / ev.EVENTS_DIR).exists()
    proc = run("--retries", "1", "--keep-going")
    assert proc.returncode == 1, proc.stderr[-2000:]  # `bad` fails for good
    invocations, attempts = ev.load(tmp_path)
    assert len(invocations) == 1 and invocations[0].closed and invocations[0].alive is False
    by_key: dict[str, list] = {}
    for att in attempts:
        by_key.setdefault(att.key, []).append(att)
    assert {k: [a.ok for a in v] for k, v in by_key.items()} == {
        "rule_make_wildcards_ok_a": [True], "rule_make_wildcards_flaky_a": [False, True],
        "rule_make_wildcards_bad_a": [False, False]}
    for att in attempts:
        assert att.end >= att.start and att.rule == "make" and att.log == [f"logs/{att.wildcards['name']}-a.log"]
        assert list(att.wildcards) == ["name", "kind"]
    ok = by_key["rule_make_wildcards_ok_a"][0]
    assert ok.seconds >= 1.0 and ok.benchmark == ["bench/ok-a.tsv"]
    (tmp_path / "out" / "bad").mkdir(exist_ok=True)
    (tmp_path / "out" / "bad" / "a.txt").write_text("made by hand\n")
    files = sorted((tmp_path / ev.EVENTS_DIR).iterdir())
    assert run().returncode == 0  # nothing to do
    assert sorted((tmp_path / ev.EVENTS_DIR).iterdir()) == files


@pytest.mark.long
def test_a_quiet_run_logs_no_job_end_and_its_jobs_are_still_done(tmp_path):
    """--quiet progress: Snakemake logs no job's end; an attempt left open at the close whose
    outputs were written after it started is a completed one."""
    from pwopsd.status.collect import _local_attempts

    (tmp_path / "Snakefile").write_text(TOY.replace('"ok", "flaky", "bad"', '"ok"'))
    proc = subprocess.run([*SNAKEMAKE, "-c1", "--logger", "pwopsd", "--quiet", "progress"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    _, (att,) = ev.load(tmp_path)
    assert att.ok is None and att.cut_off  # no end was logged
    job = cost.Job("make", {"name": "ok", "kind": "a"}, 0, output=["out/ok/a.txt"], benchmark="bench/ok-a.tsv")
    (shown,) = _local_attempts(tmp_path, job, [att], have_sacct=False)
    assert shown.state == "COMPLETED" and not shown.reason
    (tmp_path / "out" / "ok" / "a.txt").unlink()
    (shown,) = _local_attempts(tmp_path, job, [att], have_sacct=False)
    assert shown.state == "CANCELLED" and shown.reason == "Snakemake stopped while it ran"


def test_log_lines_are_shown_as_text_not_markup():
    """A failure's reason and log lines reach the terminal as written ("[rank0]: ..." is torchrun's
    prefix, "[/tmp/x]" would be a closing tag to rich)."""
    from rich.console import Console

    from pwopsd.status import render

    job = cost.Job("train", {"model": "m", "method": "opsd"}, 4, output=["x"])
    att = Attempt(1, "FAILED", 10.0, 4, 1.0, 11.0, "12", "1:0", "failed, exit 1:0", "logs/slurm/12.log",
                  ["[rank0]: RuntimeError: CUDA out of memory", "see [/tmp/x] for more"])
    status = Status("/run", ["x"], [JobStatus(job.key, "train", job.wildcards, "m", 4, 1.0, "failed", [att], ["x"], job)],
                    {"x": [job.key]}, "sacct", [])
    console = Console(width=300, record=True)
    render.terminal(status, console)
    text = console.export_text()
    assert "[rank0]: RuntimeError: CUDA out of memory" in text and "see [/tmp/x] for more" in text


def test_the_schema_knows_exactly_the_cost_models_assumptions():
    from pwopsd.config.schema import load_schema

    prop = load_schema()["properties"]["cluster"]["properties"]["cost_assumptions"]
    assert prop["propertyNames"]["enum"] == list(cost.ASSUMPTIONS)


def test_targets_are_named_as_snakemake_names_them(tmp_path):
    """./file, an absolute path inside the working directory and a rule name give the target's jobs."""
    from pwopsd.status.collect import _target_jobs

    jobs = [cost.Job("a", {}, 0, output=["r/a"]), cost.Job("b", {}, 0, input=["r/a"], output=["r/b"]),
            cost.Job("train_all", {}, 0, input=["r/b"], output=[])]
    got = _target_jobs(tmp_path, jobs, ["./r/b", str(tmp_path / "r" / "a"), "train_all", "r/missing"])
    assert got == {"./r/b": ["rule_a", "rule_b"], str(tmp_path / "r" / "a"): ["rule_a"],
                   "train_all": ["rule_a", "rule_b", "rule_train_all"], "r/missing": []}


def test_an_attempt_cut_off_with_its_snakemake_is_not_shown_running(tmp_path):
    """Events of a Snakemake that died mid-job (no close; its process gone): the open attempt is
    cut off, not running; a line still being written is left out."""
    folder = tmp_path / ev.EVENTS_DIR
    folder.mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lines = [{"event": "workflow_started", "time": 1.0, "workflow_id": "w", "host": __import__("socket").gethostname(),
              "pid": int(dead.stdout), "cwd": str(tmp_path), "snakefile": ""},
             {"event": "job_started", "time": 2.0, "jobs": [5]},
             {"event": "job_info", "time": 2.5, "jobid": 5, "rule": "train", "wildcards": {"model": "m", "method": "opsd"},
              "output": ["x"], "log": [], "benchmark": [], "resources": {}}]
    import json

    (folder / "w.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"event": "job_fin')
    invocations, attempts = ev.load(tmp_path)
    assert invocations[0].alive is False and not invocations[0].closed
    (att,) = attempts
    assert att.key == "rule_train_wildcards_m_opsd" and att.start == 2.0 and att.ok is None and att.cut_off


def test_slurm_comments_are_the_executor_plugins_names():
    """The key that joins the plan, the events and sacct: the Slurm plugin's comment."""
    from snakemake_executor_plugin_slurm.utils import get_job_wildcards

    class FakeJob:  # the one attribute get_job_wildcards reads
        wildcards = ["qwen3_4b", "pwopsd/moderate"]

    assert cost.slurm_comment("train", {"model": "qwen3_4b", "method": "pwopsd/moderate"}) == \
        f"rule_train_wildcards_{get_job_wildcards(FakeJob())}"
    assert cost.slurm_comment("aggregate_metrics", {}) == "rule_aggregate_metrics"


def test_a_target_needs_its_producer_and_everything_upstream():
    jobs = [cost.Job("a", {"x": "1"}, 0, input=[], output=["a1"]), cost.Job("a", {"x": "2"}, 0, input=[], output=["a2"]),
            cost.Job("b", {}, 0, input=["a1"], output=["b"]), cost.Job("c", {}, 0, input=["b", "a2"], output=["c", "c.csv"])]
    closure = file_closure(jobs)
    assert closure["b"] == {"rule_a_wildcards_1", "rule_b"}
    assert closure["c.csv"] == closure["c"] == {"rule_a_wildcards_1", "rule_a_wildcards_2", "rule_b", "rule_c"}


# -- the fit of the cost assumptions -----------------------------------------------------------

PLANTED = {"startup_min": 3.0, "decode": 1.7, "forward": 0.8, "train": 1.3}


def _paper_jobs():
    cfg = load_config_files([REPO / "config" / "config.yaml"])
    jobs = []
    for model in cfg["models"]:
        jobs += [cost.Job("generate", {"model": model, "checkpoint": "base"}, 4),
                 cost.Job("spines", {"model": model}, 4), cost.Job("teacher_pass", {"model": model}, 1),
                 cost.Job("mc_dropout", {"model": model}, 1)]
    jobs += [cost.Job("train", {"model": "qwen3_4b", "method": m}, 4) for m in ("opsd", "pwopsd_moderate")]
    jobs += [cost.Job("train", {"model": "dsr1_llama_8b", "method": "opsd"}, 4)]
    return cfg, jobs


def _planted_status(cfg, jobs, attempts_of=lambda job: 1) -> Status:
    """Jobs whose measured wall time is the cost model's under the planted start-up and factors:
    `attempts` x start-up + factor x work (training: its steps at the corrected throughputs)."""
    a = cost.assumptions(cfg)
    truth = {**a, "startup_min": PLANTED["startup_min"],
             "decode_tok_s_per_gpu_4b": a["decode_tok_s_per_gpu_4b"] / PLANTED["decode"],
             "stream_tok_s_4b": a["stream_tok_s_4b"] / PLANTED["decode"],
             "forward_tok_s_per_gpu_4b": a["forward_tok_s_per_gpu_4b"] / PLANTED["forward"]}
    truth["train_step_scale"] = PLANTED["train"]
    out = []
    for job in jobs:
        n = attempts_of(job)
        hours = n * PLANTED["startup_min"] / 60 + cost.job_hours(job, cfg, truth) - truth["startup_min"] / 60
        atts = [Attempt(i, "FAILED", 3600 * hours / n, job.gpus, None, None, exit_code="75:0",
                        reason="stopped on notice (exit 75): saved its work for the next attempt") for i in range(1, n)]
        atts.append(Attempt(n, "COMPLETED", 3600 * hours / n, job.gpus, None, None))
        out.append(JobStatus(job.key, job.rule, job.wildcards, job.wildcards["model"], job.gpus,
                             cost.job_hours(job, cfg, a) * job.gpus, "done", atts, [], job))
    return Status("/run", [], out, {}, "sacct", [])


def test_the_fit_recovers_a_planted_startup_throughputs_and_step_time(tmp_path):
    cfg, jobs = _paper_jobs()
    # training resumed after notices: two attempts, each with its start-up
    status = _planted_status(cfg, jobs, attempts_of=lambda job: 2 if job.rule == "train" else 1)
    new, report = fitmod.fit(status, cfg)
    a = cost.ASSUMPTIONS
    assert new["startup_min"] == pytest.approx(PLANTED["startup_min"], rel=1e-9)
    assert new["decode_tok_s_per_gpu_4b"] == pytest.approx(a["decode_tok_s_per_gpu_4b"] / PLANTED["decode"], rel=1e-9)
    assert new["stream_tok_s_4b"] == pytest.approx(a["stream_tok_s_4b"] / PLANTED["decode"], rel=1e-9)
    assert new["forward_tok_s_per_gpu_4b"] == pytest.approx(a["forward_tok_s_per_gpu_4b"] / PLANTED["forward"], rel=1e-9)
    assert new["train_step_scale"] == pytest.approx(PLANTED["train"], rel=1e-9)
    assert report["error_before"] > 1.0 and report["error_after"] < 1e-6
    # the overlay, read back as the workflow reads it, prices every job at what it cost
    path = tmp_path / "fitted.yaml"
    path.write_text(fitmod.overlay_text(new, report, status))
    fitted = load_config_files([REPO / "config" / "config.yaml", path])
    assert fitted["cluster"]["max_runtime_min"] == cfg["cluster"]["max_runtime_min"]  # an overlay, not a replacement
    for job in status.jobs:
        n = len(job.attempts)
        planned = cost.job_hours(job.job, fitted) + (n - 1) * cost.assumptions(fitted)["startup_min"] / 60
        assert planned == pytest.approx(sum(at.seconds for at in job.attempts) / 3600, rel=1e-5), job.key
    # fitting the same run again, from the overlay, changes nothing
    again, report = fitmod.fit(status, fitted)
    assert all(math.isclose(again[k], v, rel_tol=1e-5) for k, v in new.items()) and report["error_before"] < 1e-4


def test_failed_attempts_are_waste_not_model():
    """An attempt that failed (out of memory) before the job's successful one is not fitted."""
    cfg, jobs = _paper_jobs()
    status = _planted_status(cfg, jobs)
    oom = Attempt(1, "OUT_OF_MEMORY", 999.0, 4, None, None, exit_code="0:125", reason="out of memory")
    job = status.jobs[0]
    job.attempts = [oom, *job.attempts]
    new, report = fitmod.fit(status, cfg)
    assert new["startup_min"] == pytest.approx(PLANTED["startup_min"], rel=1e-9) and report["error_after"] < 1e-6


def test_a_cost_overlay_with_an_unknown_or_bad_assumption_is_refused_naming_the_key(tmp_path):
    for body, named in (({"startup_mins": 2.0}, "startup_mins"), ({"startup_min": -1}, "-1")):
        path = tmp_path / "overlay.yaml"
        path.write_text(yaml.safe_dump({"cluster": {"cost_assumptions": body}}))
        with pytest.raises(ValueError, match=r"cluster\.cost_assumptions[\s\S]*" + named):
            load_config_files([REPO / "config" / "config.yaml", path])  # every run validates its config
    # and pwopsd.cost itself, for a config not read through the schema
    with pytest.raises(SystemExit, match=r"cluster\.cost_assumptions\.startup_mins: unknown assumption"):
        cost.assumptions({"cluster": {"cost_assumptions": {"startup_mins": 2.0}}})


def test_the_cost_plan_reads_the_overlay(tmp_path):
    """python -m pwopsd.cost --configfile OVERLAY prices with the fitted start-up."""
    path = tmp_path / "overlay.yaml"
    path.write_text(yaml.safe_dump({"cluster": {"cost_assumptions": {"startup_min": 42.0}}}))
    cfg = load_config_files([REPO / "config" / "config.yaml", path])
    job = cost.Job("teacher_pass", {"model": "qwen3_4b"}, 1)
    base = load_config_files([REPO / "config" / "config.yaml"])
    assert cost.job_hours(job, cfg) - cost.job_hours(job, base) == pytest.approx((42.0 - 5.0) / 60)


# -- the tiny run ------------------------------------------------------------------------------

@pytest.mark.workflow
def test_the_status_of_the_tiny_run_shows_every_job_done_with_its_benchmark_seconds(tiny_run, tmp_path):
    """`python -m pwopsd.status` on the finished tiny run (README command 1's run): every job
    done, each target's jobs exactly those it needs, and the job-seconds spent per job those of its
    benchmark file (no Slurm here: no job holds GPUs, so job-seconds, not GPU-hours)."""
    import json

    import pandas as pd

    work, _ = tiny_run
    out, page = tmp_path / "status.json", tmp_path / "status.html"
    proc = subprocess.run([*SNAKEMAKE[:1], "-m", "pwopsd.status", "--directory", str(work), "--json", str(out),
                           "--html", str(page), "--plan-vs-spent"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    status = json.loads(out.read_text())
    jobs = status["jobs"]
    assert len(jobs) > 100 and status["counts"] == {"done": len(jobs), "running": 0, "queued": 0, "failed": 0, "waiting": 0}
    assert status["accounting"] == "benchmark files" and status["invocations"][-1]["closed"]
    assert "no job holds GPUs" in proc.stdout and "Planned against spent" in proc.stdout
    files = sorted((work / "logs" / "benchmarks").rglob("*.tsv"))
    assert sorted(work / j["job"]["benchmark"] for j in jobs) == files  # one benchmark file a job, each one's
    for job in jobs:
        (attempt,) = job["attempts"]
        measured = pd.read_csv(work / job["job"]["benchmark"], sep="\t")["s"].iloc[0]
        assert attempt["state"] == "COMPLETED" and attempt["seconds"] == pytest.approx(measured), job["key"]
    assert sum(r["spent_seconds"] for r in status["spend"]) == pytest.approx(
        sum(pd.read_csv(f, sep="\t")["s"].iloc[0] for f in files))
    # a table's jobs are the runs it shows and what they need, not the other tables' runs
    cfg = yaml.safe_load((work / "config" / "config.yaml").read_text())
    main = status["target_jobs"]["results/tables/main_4b.tex"]
    trained = {k.removeprefix("rule_train_wildcards_tiny_qwen3_").split("-seed")[0] for k in main if k.startswith("rule_train_")}
    assert trained == set(cfg["tables"]["main"]["methods"])
    assert "rule_build_tiny_model_wildcards_tiny_qwen3" in main and "rule_spines_wildcards_tiny_qwen3" not in main
    assert "progress" in page.read_text() and "<script" not in page.read_text()
    # After a config change the jobs Snakemake will make again are waiting, with its own reason, not done
    overlay = tmp_path / "hotter.yaml"
    overlay.write_text("evaluation: {temperature: 0.9}\n")
    proc = subprocess.run([*SNAKEMAKE[:1], "-m", "pwopsd.status", "--directory", str(work), "--configfile", str(overlay),
                           "--json", str(out)], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    after = {j["key"]: j for j in json.loads(out.read_text())["jobs"]}
    again = {k: j for k, j in after.items() if j["rerun"]}
    assert {j["rule"] for j in again.values() if j["rerun"].startswith("Params have changed")} >= {"generate"}
    assert all(j["state"] == "waiting" for j in again.values()) and "will be made again" in proc.stdout
    assert after["rule_build_tiny_model_wildcards_tiny_qwen3"]["state"] == "done"
    assert sum(j["state"] == "done" for j in after.values()) == len(after) - len(again)


# -- attempts across invocations, requeues and the fit's constraints ------------------------------

def _events(folder, name, host, pid, events):
    import json
    import socket

    lines = [{"event": "workflow_started", "time": events[0][0] - 1, "workflow_id": name, "cwd": "", "snakefile": "",
              "host": host or socket.gethostname(), "pid": pid}]
    for t, kind, extra in events:
        lines.append({"event": kind, "time": t, **extra})
    (folder / f"{name}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_a_job_cut_off_in_one_run_and_made_in_the_next_has_two_attempts(tmp_path):
    """The first Snakemake (on another host, never closed) was stopped while the job ran; the
    second made it: the first attempt is cut off (not running, not completed, no time), the second
    completed with its benchmark's seconds. While a live run's job is still marked incomplete by
    Snakemake it runs, whatever outputs exist."""
    import os

    from pwopsd.status.collect import _local_attempts
    from pwopsd.status.plan import incomplete_marker

    folder = tmp_path / ev.EVENTS_DIR
    folder.mkdir(parents=True)
    info = {"jobid": 3, "rule": "make", "wildcards": {"name": "x"}, "output": ["out/x"], "log": [],
            "benchmark": ["bench/x.tsv"], "resources": {}, "local": True}
    _events(folder, "a", "login-node-7", 1, [(10.0, "job_info", info)])
    _events(folder, "b", None, None, [(20.0, "job_started", {"jobs": [3]}), (21.0, "job_info", info),
                                      (50.0, "job_finished", {"jobid": 3}), (51.0, "closed", {})])
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("made\n")
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "x.tsv").write_text("s\th:m:s\n28.5\t0:00:28\n")
    invocations, attempts = ev.load(tmp_path)
    assert [i.alive for i in invocations] == [None, False]
    job = cost.Job("make", {"name": "x"}, 0, output=["out/x"], benchmark="bench/x.tsv")
    first, second = _local_attempts(tmp_path, job, attempts, have_sacct=False)
    assert (first.state, first.seconds, first.reason) == ("CANCELLED", None, "Snakemake stopped while it ran")
    assert (second.state, second.seconds, second.start) == ("COMPLETED", 28.5, 20.0)
    # a live run (this process), its job's end not logged: incomplete while Snakemake marks it
    _events(folder, "c", None, os.getpid(), [(100.0, "job_info", {**info, "jobid": 1})])
    os.utime(tmp_path / "out" / "x", (200.0, 200.0))
    marker = incomplete_marker(tmp_path, "out/x")
    marker.parent.mkdir(parents=True)
    marker.write_text("{}")
    _, attempts = ev.load(tmp_path)
    assert _local_attempts(tmp_path, job, attempts, have_sacct=False)[-1].state == "RUNNING"
    marker.unlink()
    assert _local_attempts(tmp_path, job, attempts, have_sacct=False)[-1].state == "COMPLETED"


def test_the_incomplete_marker_is_snakemakes(tmp_path):
    """The path of Snakemake's own record (its FilePersistence._record_path, names of at most 255
    characters), for a short and a long output path."""
    from snakemake.persistence.file import FilePersistence

    from pwopsd.status.plan import incomplete_marker

    persistence = object.__new__(FilePersistence)  # only the record layout is used: no lock, no folders
    persistence._max_len = 255
    for output in ("results/tables/main_4b.tex", "results/" + "x" * 300):
        assert incomplete_marker(tmp_path, output) == Path(
            persistence._record_path(str(tmp_path / ".snakemake" / "incomplete"), output))


def _record(jobid, state, exit_code="0:0", seconds=10.0):
    from pwopsd.status.slurm import SlurmAttempt

    return SlurmAttempt(jobid, "rule_train_wildcards_m_opsd", state, exit_code, seconds, 1.0, 2.0, 3.0, 4, "gpu", "n1",
                        "01:00:00", "/w")


def test_a_requeued_jobs_runs_share_its_log_which_is_the_latest_runs(tmp_path):
    """Slurm reuses a requeued job's id and log: the earlier run's reason is its state's, the log
    (and what it says) the latest run's; a run stopped on notice is told by its log's line."""
    from pwopsd.status.collect import _slurm_attempts

    job = cost.Job("train", {"model": "m", "method": "opsd"}, 4, output=["adapter"])
    logdir = tmp_path / "logs/slurm/rule_train/m_opsd"
    logdir.mkdir(parents=True)
    (logdir / "7.log").write_text("pwopsd job stopped on notice: stopped on SIGTERM after step 4 of 16\n")
    (logdir / "8.log").write_text("step 16 done\n")
    first, second, third = _slurm_attempts(tmp_path, job, [_record("7", "REQUEUED"), _record("7", "FAILED", "1:0"),
                                                            _record("8", "COMPLETED")], ["logs/slurm"])
    assert (first.log, first.reason) == (None, "requeued by Slurm (preemption, node failure or scontrol requeue)")
    assert second.log == "logs/slurm/rule_train/m_opsd/7.log" and second.reason.startswith("stopped on notice")
    assert second.resubmitted_after_notice and third.resubmitted_after_notice and third.reason == ""


def test_the_fit_keeps_every_value_positive_and_leaves_out_non_resumable_requeues():
    """Noisy measurements whose plain least squares wants a negative start-up: the fit keeps every
    coefficient positive, prices the jobs closer than before, and writes only positive values; a
    requeued run of a rule that cannot resume (MC dropout restarts from nothing) is not fitted."""
    import numpy as np

    cfg, jobs = _paper_jobs()
    status = _planted_status(cfg, [j for j in jobs if j.rule != "train"])
    rng = np.random.default_rng(2)
    for job in status.jobs:  # start-up nearly 0 and 8% noise
        (att,) = job.attempts
        work = 3600 * (cost.job_hours(job.job, cfg) - cost.assumptions(cfg)["startup_min"] / 60)
        att.seconds = 1.0 + 0.4 * work * (1 + 0.08 * rng.standard_normal())
    new, report = fitmod.fit(status, cfg)
    assert len(fitmod.samples(status)) == len(status.jobs) == 12
    assert all(v > 0 for v in new.values()) and report["error_after"] < report["error_before"] / 5, (new, report)
    assert {"startup_min", "decode_tok_s_per_gpu_4b", "stream_tok_s_4b"} <= set(new)
    mc = next(j for j in status.jobs if j.rule == "mc_dropout")
    mc.attempts = [Attempt(1, "REQUEUED", 500.0, 1, None, None, reason="requeued by Slurm"), *mc.attempts]
    (sample,) = [s for s in fitmod.samples(status) if s.job is mc]
    assert sample.attempts == 1 and sample.spent_h == pytest.approx(mc.attempts[-1].seconds / 3600)


def test_nonnegative_least_squares_against_a_brute_force_search():
    import numpy as np

    rng = np.random.default_rng(0)
    x = np.abs(rng.normal(size=(12, 3))) + 0.1
    y = x @ np.array([2.0, -1.0, 0.5]) + 0.01 * rng.normal(size=12)
    coef = fitmod.nonnegative_lstsq(x, y, keep=0)
    assert coef[1] == 0 and coef[0] > 0 and coef[2] > 0
    # no grid point with non-negative coefficients fits better
    err = ((x @ coef - y) ** 2).sum()
    grid = np.linspace(0, 3, 31)
    assert all(((x @ np.array([a, b, c]) - y) ** 2).sum() >= err - 1e-9 for a in grid for b in grid[:5] for c in grid)


def test_a_logs_tail_keeps_the_lines_that_say_why_it_ended(tmp_path):
    """Slurm's kill message followed by more than a tail of other lines (a loaded node): the lines
    naming the cause come first, then the last lines before the job's own Snakemake error block."""
    from pwopsd.status.collect import TAIL_LINES, tail

    log = tmp_path / "3.log"
    log.write_text("\n".join(["loading", "slurmstepd-vm: error: Exceeded job memory limit",
                               "srun: error: vm: task 0: Killed", *(f"line {i}" for i in range(10)),
                               "Error in rule candidates:", "    jobid: 0", "Shutting down"]) + "\n")
    shown = tail(log)
    assert shown[0] == "slurmstepd-vm: error: Exceeded job memory limit"
    assert shown[1:] == [f"line {i}" for i in range(10 - TAIL_LINES, 10)]
    log.write_text("a\nb\nslurmstepd: x\nc\n")  # a short log: the cause is in the tail already
    assert tail(log) == ["a", "b", "slurmstepd: x", "c"]


def test_a_failed_slurm_job_whose_head_ran_on_another_host_is_failed_not_queued_forever(tmp_path):
    """A head Snakemake on another login node, never closed (its process cannot be seen from here):
    its open attempt holds the job while Slurm says the job pends or runs, and is closed once Slurm
    says it ended, so a failure shows "failed", not "queued" for ever. A head alive on this host
    still holds a just-failed job (its retry is on the way)."""
    import socket

    from pwopsd.status.collect import _head_open, _slurm_attempts, _state

    folder = tmp_path / ev.EVENTS_DIR
    folder.mkdir(parents=True)
    info = {"jobid": 1, "rule": "train", "wildcards": {"model": "m", "method": "opsd"}, "output": ["adapter"], "log": [],
            "benchmark": [], "resources": {}, "local": False}
    _events(folder, "elsewhere", "login2." + socket.gethostname(), 1, [(10.0, "job_info", info)])
    _events(folder, "here", None, __import__("os").getpid(), [(10.0, "job_info", info)])
    invocations, local = ev.load(tmp_path)
    alive = {inv.workflow_id: inv.alive for inv in invocations}
    assert alive == {"elsewhere": None, "here": True}
    job = cost.Job("train", {"model": "m", "method": "opsd"}, 4, output=["adapter"])

    def state(invocation, slurm_state):
        attempts = _slurm_attempts(tmp_path, job, [_record("7", slurm_state, "1:0")], ["logs/slurm"])
        mine = [la for la in local if la.invocation == invocation]
        return _state(tmp_path, job, attempts, _head_open(mine, attempts, alive))

    assert state("elsewhere", "PENDING") == "queued" and state("elsewhere", "RUNNING") == "running"
    assert state("elsewhere", "FAILED") == "failed" and state("elsewhere", "OUT_OF_MEMORY") == "failed"
    assert state("here", "FAILED") == "queued"


def test_the_dry_runs_reasons_are_read_with_its_jobs():
    """Which jobs Snakemake will run, and why, come from its own dry run's listing."""
    listing = ("rule grade:\n    input: a.parquet\n    output: b.parquet\n    jobid: 3\n"
               "    reason: Params have changed since last execution: Union of exclusive params before and now\n"
               "    wildcards: model=m\n    resources: tmpdir=/tmp\n\nlocalrule all:\n    input: b.parquet\n"
               "    jobid: 0\n    reason: Input files updated by another job: b.parquet\n")
    grade, everything = cost.parse_dry_run(listing)
    assert grade.reason.startswith("Params have changed") and grade.wildcards == {"model": "m"}
    assert everything.rule == "all" and everything.reason.startswith("Input files updated")
