"""The Slurm profile, and the workflow on a real Slurm.

* `--profile slurm` resolves from the repository root and dry-runs every paper target: GPU rules
  ask for `gpu_model=h100` with the model entry's GPU count on the GPU partition, CPU rules for
  none on the CPU partition, each job with the threads the profile gives it (not this machine's
  2 cores), runtimes capped at `cluster.max_runtime_min`; CHANGE_ME values stop a run before any
  job, naming the file and key;
* every rule named in the profile exists (Snakemake ignores unknown names silently);
* the tiny workflow's diagnostic Phases A-E run through the Slurm executor plugin on a real
  single-node Slurm (tests/slurm/cluster.py: slurmctld, slurmd, slurmdbd + MariaDB, munge, fake
  h100 GPUs): `sacct` records each job COMPLETED with its GPUs, partition and CPUs, and a job
  that Slurm kills for its memory is resubmitted with the attempt-scaled limits; one requeued
  while it runs resumes under its job id; `python -m pwopsd.status` follows it all (below);
* two tiny trainings on it, one warned by slurmctld's time-limit timer and resubmitted, one
  requeued with `scontrol requeue`, resume from the checkpoint written on notice and end with the
  uninterrupted run's adapter and step log, bit for bit;
* `snakemake --lint` passes.
"""

import os
import json
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest
import yaml

import background
from conftest import REPO, copy_tiny_inputs, job_counts, run_snakemake, screenshot, session_tmp, unavailable
from pwopsd.cluster import MAX_RUNTIME_ENV
from pwopsd.cost import parse_dry_run

PROFILE = REPO / "profiles" / "slurm" / "profile.yaml"
PAPER_TARGETS = ["results/tables/main_4b.tex", "results/tables/schedules_4b.tex", "results/tables/cross_model.tex",
                 "results/tables/ablation_4b.tex", "results/tables/branch_auroc.tex", "results/figures/branch_auroc.pdf",
                 "results/figures/pwopsd_schedules.pdf", "all"]
GPU_RULES = {"generate", "train", "spines", "teacher_pass", "mc_dropout", "forced_continuation"}


def profile():
    return yaml.safe_load(PROFILE.read_text())


def filled_profile(tmp_path, *, threads=None, account="myacct", fill=True):
    """The user's one-file edit: a copy of the profile with the CHANGE_ME values set (``fill``).
    Its jobs run in this test environment, which holds every package: the profile's
    software-deployment-method (conda, which these machines cannot install: the job environments'
    CUDA wheels and conda itself are not on PyPI) is left out; test_the_profile_deploys_conda_environments
    checks it is there and what a node without conda is told."""
    text = PROFILE.read_text()
    if fill:
        text = (text.replace("CHANGE_ME_ACCOUNT", account).replace("CHANGE_ME_CPU_PARTITION", "cpu")
                .replace("CHANGE_ME_GPU_PARTITION", "gpu").replace("CHANGE_ME_GPU_TYPE", "h100"))
    prof = yaml.safe_load(text)
    prof.pop("software-deployment-method")
    if threads is not None:
        prof["set-threads"] = {rule: threads for rule in prof["set-threads"]}
    d = tmp_path / "slurm"
    d.mkdir(parents=True)
    (d / "profile.yaml").write_text(yaml.safe_dump(prof, sort_keys=False))
    return d


def test_profile_resolves_from_the_repo_root_and_dry_runs_every_paper_target(tmp_path):
    assert (REPO / "slurm").resolve() == PROFILE.parent.resolve()
    proc = run_snakemake(["-n", "--profile", str(filled_profile(tmp_path)), *PAPER_TARGETS])
    out = proc.stdout + proc.stderr
    jobs = [(job.rule, job.resources, job.threads) for job in parse_dry_run(out)]
    rules = {rule for rule, _, _ in jobs}
    assert GPU_RULES <= rules and {"grade", "merge_adapter", "viability_labels", "candidates"} <= rules
    set_threads = profile()["set-threads"]
    for rule, res, threads in jobs:
        assert res["slurm_account"] == "myacct"
        if rule in GPU_RULES:
            expected = {"spines": 4, "forced_continuation": 4, "teacher_pass": 1, "mc_dropout": 1}.get(rule, 4)
            assert res.get("gpu") == str(expected) and res.get("gpu_model") == "h100", (rule, res)
            assert int(res["cpus_per_task"]) >= 8 and int(res["mem_mb"]) >= 128000
            assert res["slurm_partition"] == "gpu", (rule, res)
        else:
            assert "gpu_model" not in res and res.get("gpu", "0") == "0", (rule, res)
            assert res["slurm_partition"] == "cpu", (rule, res)  # CPU-only jobs to the CPU partition
        # The threads the profile gives (= cpus_per_task), not this 2-core machine's count.
        if rule in set_threads:
            assert threads == set_threads[rule] == int(res["cpus_per_task"]), (rule, threads, res)
    runtimes = {rule: int(res["runtime"]) for rule, res, _ in jobs}
    assert runtimes["train"] >= 600 and runtimes["generate"] >= 240 and runtimes["merge_adapter"] <= 120


def capped_runtimes(expressions, attempts, max_runtime):
    """Runtime (minutes) of each profile expression per attempt, the environment variable set as the
    Snakefile sets it (Snakemake expands it, then evaluates the expression with `attempt`)."""
    out = {}
    for rule, expr in expressions:
        text = str(expr).replace(f"${MAX_RUNTIME_ENV}", str(max_runtime))
        out[rule] = [int(eval(text, {"__builtins__": {"min": min}}, {"attempt": a})) for a in range(1, attempts + 1)]
    return out


def test_runtimes_of_every_attempt_are_capped_at_the_partition_maximum():
    prof = profile()
    exprs = [("default", prof["default-resources"]["runtime"])]
    exprs += [(rule, res["runtime"]) for rule, res in prof["set-resources"].items() if "runtime" in res]
    cfg_max = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["cluster"]["max_runtime_min"]
    for cap in (cfg_max, 600):
        runtimes = capped_runtimes(exprs, attempts=3, max_runtime=cap)
        assert all(max(r) <= cap for r in runtimes.values()), runtimes
    assert capped_runtimes(exprs, 3, cfg_max)["train"] == [720, 1440, 2160]  # within 48 h
    assert capped_runtimes(exprs, 3, 1440)["train"] == [720, 1440, 1440]


def test_change_me_values_stop_the_run_before_any_job_naming_file_and_key(tmp_path):
    work = tmp_path / "work"
    shutil.copytree(REPO / "config", work / "config")
    proc = run_snakemake(["--profile", "slurm", "--directory", str(work), "results/data/benchmarks/math500.parquet"],
                         check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    for key in ("default-resources.slurm_account is CHANGE_ME_ACCOUNT", "default-resources.slurm_partition is "
                "CHANGE_ME_CPU_PARTITION", "set-resources.generate.slurm_partition is CHANGE_ME_GPU_PARTITION",
                "set-resources.train.gpu_model is CHANGE_ME_GPU_TYPE"):
        assert f"profiles/slurm/profile.yaml: {key}" in out, out[-2000:]
    assert not (work / "results").exists() and not (work / "logs").exists()  # not even a local job ran


@pytest.mark.parametrize("flags, shown", [(["-n"], "Job stats:"), (["-np"], "Job stats:"), (["--dag"], "digraph snakemake_dag"),
                                          (["--rulegraph"], "digraph snakemake_dag"), (["--summary"], "output_file\tdate")])
def test_a_run_that_submits_nothing_shows_its_plan_with_one_warning(tmp_path, flags, shown):
    """Before the account is filled in, a dry run (and --dag, --rulegraph, --summary) warns once,
    naming the keys, and shows the plan: jobs with their GPUs and partitions."""
    work = tmp_path / "work"
    shutil.copytree(REPO / "config", work / "config")
    proc = run_snakemake(flags + ["--profile", str(filled_profile(tmp_path, fill=False)), "--directory", str(work),
                                  "results/tables/main_4b.tex"])
    out = proc.stdout + proc.stderr
    assert out.count("the Slurm profile is not set up") == 1, out[-3000:]
    for key in ("default-resources.slurm_account is CHANGE_ME_ACCOUNT", "set-resources.train.slurm_partition is "
                "CHANGE_ME_GPU_PARTITION"):
        assert f"profiles/slurm/profile.yaml: {key}" in out
    assert shown in proc.stdout + proc.stderr
    if flags[0].startswith("-n"):
        counts = job_counts(out)
        assert counts["train"] == 5 and counts["table"] == 1, counts
        assert re.search(r"rule train:(?:\n    [^\n]*)*?\n    resources: [^\n]*slurm_partition=CHANGE_ME_GPU_PARTITION[^\n]*gpu=4, gpu_model=CHANGE_ME_GPU_TYPE", out)
    assert not (work / "results").exists() and not (work / "logs").exists()


def test_planning_flags_are_read_as_snakemake_reads_them():
    from pwopsd.cluster import planning_flag

    assert planning_flag(["-np", "--profile", "slurm", "target"]) == "--dry-run"
    assert planning_flag(["--profile", "slurm", "--dag", "mermaid-js"]) == "--dag"
    assert planning_flag(["--rulegraph"]) == "--rulegraph" and planning_flag(["-S"]) == "--summary"
    for submits in (["--profile", "slurm", "target"], ["-p", "--jobs", "4"], ["--touch"], ["--dag", "pdf"]):  # the last: Snakemake stops on it itself
        assert planning_flag(submits) is None, submits


def test_profile_names_only_existing_rules():
    names = set()
    for config in (REPO, REPO / "tiny"):
        proc = run_snakemake(["--list-rules", "--directory", str(config)])
        names |= set(proc.stdout.split())
    prof = profile()
    assert set(prof["set-resources"]) <= names, set(prof["set-resources"]) - names
    assert set(prof["set-threads"]) <= names, set(prof["set-threads"]) - names
    assert "gpu_model" not in prof["default-resources"]  # would make every CPU job request a GPU
    assert prof["executor"] == "slurm" and prof["rerun-incomplete"] and prof["retries"] >= 1


def test_the_default_profile_paces_the_scheduler_as_documented():
    """The pace every run takes (docs/decisions.md, "Snakemake's scheduler"), read by Snakemake's own
    parser: rounds every 5 s, not once a second per finished job, and a run ends at most 5 s after
    its last job; submissions stay at or below Snakemake's default rate (100 a second)."""
    from snakemake.settings.types import MaxJobsPerTimespan

    default = yaml.safe_load((REPO / "profiles" / "default" / "profile.yaml").read_text())
    pace = MaxJobsPerTimespan.parse_choice(default["max-jobs-per-timespan"])
    assert pace.timespan == 5 and pace.max_jobs / pace.timespan <= 100
    assert set(default) == {"cores", "max-jobs-per-timespan"}  # nothing that would replace the Slurm profile's values
    assert "max-jobs-per-timespan" not in profile()


def test_slurm_durations_read_as_sacct_prints_them():
    from slurm.cluster import slurm_seconds

    assert slurm_seconds("00:01.500") == 1.5 and slurm_seconds("12:34.5") == 754.5
    assert slurm_seconds("01:02:03") == 3723 and slurm_seconds("1-00:00:01") == 86401
    assert slurm_seconds("") == 0
    with pytest.raises(ValueError, match="not a Slurm duration"):
        slurm_seconds("17")


def test_lint_passes():
    proc = run_snakemake(["--lint"], check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_killed_sessions_links_to_its_stopped_cluster_are_removed_and_no_others(tmp_path):
    """A session killed before its tear-down leaves /etc/slurm linked to a cluster that no longer
    runs, and every Snakemake start then waits about 9 s on scontrol; the next session removes
    those links (conftest.py), and only those: a running or starting cluster's, another harness's
    and a real installation's stay."""
    from slurm.cluster import MARKER, unlink_stale_system_conf

    def cluster(name, pid=None):
        etc = tmp_path / name / "etc"
        (tmp_path / name / "run").mkdir(parents=True)
        etc.mkdir()
        for f in ("slurm.conf", "gres.conf", MARKER):
            (etc / f).write_text("")
        if pid is not None:
            (tmp_path / name / "run" / "slurmctld.pid").write_text(f"{pid}\n")
        return etc

    def system(target_etc):
        conf = tmp_path / f"system-{target_etc.parent.name}" / "slurm.conf"
        conf.parent.mkdir()
        conf.symlink_to(target_etc / "slurm.conf")
        (conf.parent / "gres.conf").symlink_to(target_etc / "gres.conf")
        return conf

    dead = system(cluster("dead", pid=2**22 + 1))  # above Linux's largest PID: no such process
    assert unlink_stale_system_conf(dead) == [dead, dead.parent / "gres.conf"]
    assert not dead.is_symlink() and not (dead.parent / "gres.conf").is_symlink()
    removed_tree = system(cluster("removed"))
    shutil.rmtree(tmp_path / "removed")  # the cluster's folder gone too: a dangling link
    assert unlink_stale_system_conf(removed_tree) == [removed_tree, removed_tree.parent / "gres.conf"]
    alive = system(cluster("alive", pid=os.getpid()))
    assert unlink_stale_system_conf(alive) == [] and alive.is_symlink()
    starting = system(cluster("starting"))  # linked, its slurmctld not started yet: another session's start
    assert unlink_stale_system_conf(starting) == [] and starting.is_symlink()
    other_etc = cluster("other")
    (other_etc / MARKER).unlink()
    other = system(other_etc)
    assert unlink_stale_system_conf(other) == [] and other.is_symlink()
    real = tmp_path / "real" / "slurm.conf"
    real.parent.mkdir()
    real.write_text("ClusterName=site\n")
    assert unlink_stale_system_conf(real) == [] and real.read_text() == "ClusterName=site\n"


@background.part("Slurm cluster start")
def _slurm_cluster():
    """A real single-node Slurm (tests/slurm/cluster.py; its Debian packages installed when
    missing), started in the background from the session's start. Its folder is outside pytest's
    private temporary folders: the munge, mysql and slurm users reach it."""

    def start():
        import tempfile

        from slurm.cluster import SlurmCluster

        root = tempfile.mkdtemp(prefix="pwopsd-slurm-")
        cluster = SlurmCluster(root)
        background.at_session_end(lambda: _stop(cluster))
        cluster.start()
        return cluster

    return start


def _stop(cluster):
    if cluster.root.exists():
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)


def slurm_part(name: str):
    """A part of the test Slurm's (waited for); with no cluster on the machine, a skip, or in CI a
    failure (CI installs what the cluster needs: a missing install there is a failure)."""
    from slurm.cluster import SlurmUnavailable

    try:
        return background.result(name)
    except SlurmUnavailable as exc:
        unavailable(f"no test cluster on this machine: {exc}")


@pytest.fixture(scope="module")
def slurm_cluster():
    """The test Slurm, stopped after this module's tests (or, should the session end first, at its end)."""
    cluster = slurm_part("Slurm cluster start")
    yield cluster
    cluster.stop()
    assert cluster.running() == []  # every daemon it started is gone
    shutil.rmtree(cluster.root, ignore_errors=True)


@background.part("Slurm diagnostic", after=("Slurm cluster start", "tiny model"))
def _slurm_diagnostic():
    """The tiny diagnostic's GPU and CPU phases (A-E) through the Slurm executor on a real Slurm.

    The working directory starts from the tiny run's model and data (it starts as soon as they
    exist); the tiny model entry asks for GPUs (2 for generation, 1 for forwards: the HF backend
    still runs on the CPU), as a paper model would. The profile is the user's one-file edit
    (account, partitions) plus what a 2-CPU node can hold: one CPU and one thread per job, memory
    that fits. `candidates` asks for too little memory on its first attempt, is killed by Slurm and
    is resubmitted with the attempt-scaled limits. The status is taken every 2 s meanwhile
    (:func:`_watch_status`), which requeues the forced-continuation job once it runs. The
    diagnostic runs on 4 problems per level instead of 12.
    """

    def run():
        from slurm.cluster import SlurmUnavailable

        try:
            cluster = background.result("Slurm cluster start")
        except SlurmUnavailable:
            return None  # the fixture skips
        source = background.result("tiny model")
        work = session_tmp("slurm_work")
        copy_tiny_inputs(source, work)
        config = yaml.safe_load((REPO / "tiny" / "config" / "config.yaml").read_text())
        config["models"]["tiny_qwen3"]["gpus"] = {"generate": 2, "train": 0, "forward": 1}
        config["cluster"] = {"gpu_jobs_on_cpu": True}  # the test Slurm's GPUs are device files: said, not found
        config["models"]["tiny_qwen3"]["vllm"] = {"tensor_parallel_size": 2}
        config["models"]["tiny_qwen3"]["size_b"] = 4.0  # the cost plan prices its GPU jobs as a 4B model's (pwopsd.status)
        # A third of the tiny run's problems: the jobs, resources and retries are what is tested here.
        config["diagnostic"]["datasets"] = {name: 4 for name in config["diagnostic"]["datasets"]}
        (work / "config").mkdir()
        (work / "config" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        prof_dir = filled_profile(session_tmp("profile"), threads=1, account=cluster.account)
        prof = yaml.safe_load((prof_dir / "profile.yaml").read_text())
        prof["default-resources"]["cpus_per_task"] = 1
        for rule, res in prof["set-resources"].items():
            res.update(cpus_per_task=1, mem_mb="3000 * attempt")
        prof["set-resources"]["candidates"]["mem_mb"] = "200 * attempt ** 4"  # 200 MB: killed; then 3200 MB
        (prof_dir / "profile.yaml").write_text(yaml.safe_dump(prof, sort_keys=False))
        snapshots, requeued, stop = [], [], threading.Event()
        watcher = threading.Thread(target=_watch_status, args=(work, cluster, snapshots, stop, requeued), daemon=True)
        watcher.start()
        before = {job["jobid"] for job in cluster.jobs()}
        try:
            proc = run_snakemake(["--profile", str(prof_dir), "--directory", str(work), *DIAGNOSTIC_TARGETS,
                                  "--slurm-init-seconds-before-status-checks", "1", "--seconds-between-status-checks", "2"],
                                 env={"SLURM_CONF": str(cluster.conf)}, check=False)
        finally:
            stop.set()
            watcher.join()
        count_jobs_cpu(cluster, before)
        return work, proc, cluster.jobs(), snapshots, requeued

    return run


def count_jobs_cpu(cluster, before: set[str]) -> None:
    """The CPU-seconds of the Slurm jobs a part submitted (every run of each job that was not in
    ``before``, as Slurm's accounting measured them) into its line of the phase report: they run
    under slurmd, not below the session (tests/background.py)."""
    ran = [job for job in cluster.jobs(all_runs=True) if job["jobid"] not in before]
    background.add_cpu(sum(job["cpu_seconds"] for job in ran), "Slurm's jobs")


# The diagnostic job interrupted while it runs: requeued by Slurm (as a preemption would), it stops
# on notice and runs again under its job id, resuming.
REQUEUED_RULE = "forced_continuation"


def _watch_status(work, cluster, snapshots, stop, requeued):
    """What `python -m pwopsd.status` shows while the run goes on (pwopsd.status.collect, every 2
    s): each status whose counts or running jobs differ from the last one's. Once the
    REQUEUED_RULE job has run 3 s, it is requeued (its job id goes into ``requeued``)."""
    from pwopsd.status import collect

    last = None
    while not stop.is_set():
        try:
            status = collect(work, DIAGNOSTIC_TARGETS, env=cluster.env())
            seen = (tuple(status.counts().items()), tuple((j.key, j.state) for j in status.jobs))
            if seen != last:
                snapshots.append(status)
                last = seen
            for job in status.jobs:
                att = job.attempts[-1] if job.attempts else None
                if (job.rule == REQUEUED_RULE and not requeued and att and att.state == "RUNNING"
                        and (att.seconds or 0) >= 3):
                    _requeue_now(att.slurm_jobid, cluster)
                    requeued.append(att.slurm_jobid)
        except Exception as exc:  # noqa: BLE001 - reported by the test that reads the snapshots
            snapshots.append(repr(exc))
        stop.wait(2)


@pytest.fixture(scope="module")
def slurm_run(slurm_cluster):
    return background.result("Slurm diagnostic")


DIAGNOSTIC_TARGETS = [f"results/diagnostic/tiny_qwen3/{name}.parquet" for name in ("mc_dropout", "forced_continuations")]


def jobs_by_rule(jobs):
    out = {}
    for job in sorted(jobs, key=lambda j: int(j["jobid"])):
        out.setdefault(job["comment"].removeprefix("rule_").split("_wildcards_")[0], []).append(job)
    return out


@pytest.mark.workflow
def test_tiny_diagnostic_runs_through_a_real_slurm(slurm_run):
    work, proc, jobs, *_ = slurm_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    mc = pd.read_parquet(work / "results/diagnostic/tiny_qwen3/mc_dropout.parquet")
    cont = pd.read_parquet(work / "results/diagnostic/tiny_qwen3/forced_continuations.parquet")
    assert len(mc) > 0 and len(cont) == 18 * len(mc)
    by_rule = jobs_by_rule(jobs)
    assert set(by_rule) == {"spines", "teacher_pass", "candidates", "mc_dropout", "forced_continuation"}
    assert all(runs[-1]["state"] == "COMPLETED" and runs[-1]["exit"] == "0:0" for runs in by_rule.values()), by_rule
    # Slurm's accounting measured each job's CPU time (the phase report counts it: count_jobs_cpu):
    # every job started Python and loaded torch, more than a CPU-second
    assert all(runs[-1]["cpu_seconds"] > 1 for runs in by_rule.values()), by_rule


@pytest.mark.workflow
def test_gpus_partitions_and_cpus_reach_slurm_per_rule(slurm_run):
    _, _, jobs, *_ = slurm_run
    expected_gpus = {"spines": 2, "forced_continuation": 2, "teacher_pass": 1, "mc_dropout": 1}
    for rule, runs in jobs_by_rule(jobs).items():
        for job in runs:
            assert job["account"] == "pwopsd" and "cpu=1" in job["tres"], job
            if rule in expected_gpus:
                assert f"gres/gpu:h100={expected_gpus[rule]}" in job["tres"] and job["partition"] == "gpu", job
                # the job's step (Snakemake's inner srun) holds the same GPUs
                assert any(f"gres/gpu={expected_gpus[rule]}" in step for step in job["steps"]), job
            else:
                assert "gres/gpu" not in job["tres"] and job["partition"] == "cpu", job


@pytest.mark.workflow
def test_a_job_killed_for_its_memory_is_resubmitted_with_larger_limits(slurm_run):
    work, proc, jobs, *_ = slurm_run
    first, second = jobs_by_rule(jobs)["candidates"]
    assert first["state"] in ("FAILED", "OUT_OF_MEMORY") and first["reqmem"] == "200M" and first["timelimit"] == "00:30:00"
    slurm_log = (work / "logs" / "slurm" / "rule_candidates" / "tiny_qwen3" / f"{first['jobid']}.log").read_text()
    assert "exceeded job memory limit" in slurm_log.lower()  # Slurm killed it, as a cluster would
    assert second["state"] == "COMPLETED" and second["reqmem"] == "3200M" and second["timelimit"] == "01:00:00"
    assert "Error in rule candidates" in proc.stdout + proc.stderr  # reported failed, then retried


# Two tiny training runs on the test Slurm, each interrupted after its third step. One is warned by
# Slurm's own time-limit timer: its limit is cut to end 4-5 minutes from now (`scontrol update
# TimeLimit`), inside the profile's `--signal=TERM@600` warning window, and slurmctld's next
# time-limit check (every 30 s) sends the warning to the job's steps. Its training is held (SIGSTOP)
# until then, so that the warning lands mid-run however quickly the tiny run would otherwise
# finish; Slurm sends SIGCONT before a warning signal, which releases it. The other is requeued
# with `scontrol requeue` (Slurm's SIGTERM, then the same job id runs again).
INTERRUPTED = {"opsd": "time limit", "eopd": "requeue"}
INTERRUPT_AFTER_STEPS = 3


def _training_processes(jobid):
    """The PIDs of the training script's processes in Slurm job `jobid` (Snakemake runs it as
    ``python .snakemake/scripts/tmp<...>.train.py``)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if (proc.name.isdigit() and b"train.py" in (proc / "cmdline").read_bytes()
                    and f"\0SLURM_JOB_ID={jobid}\0".encode() in b"\0" + (proc / "environ").read_bytes()):
                pids.append(int(proc.name))
        except OSError:  # gone meanwhile
            continue
    return pids


def _stopped(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def _warn_by_time_limit(cluster, jobid, env, record):
    """Hold the job's training, cut its time limit under the profile's warning window, and wait for
    slurmctld's warning. `record` gets the limit set (``limit_min``), whether slurmctld logged the
    warning and the held processes were released (``warned``), or what went wrong (``error``); the
    training is never left stopped."""
    import os
    import signal
    import subprocess
    import time

    pids = _training_processes(jobid)
    try:
        assert pids, f"no training process in job {jobid}"
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        shown = subprocess.run(["scontrol", "show", "job", jobid], env=env, capture_output=True, text=True, check=True).stdout
        d, h, m, sec = (int(x or 0) for x in re.search(r"RunTime=(?:(\d+)-)?(\d+):(\d+):(\d+)", shown).groups())
        # The cut limit ends 4-5 minutes from now: inside the 10-minute warning window, so the next
        # 30-s check warns, with minutes left for the step, the checkpoint and the exit.
        record["limit_min"] = limit = (((d * 24 + h) * 60 + m) * 60 + sec) // 60 + 5
        subprocess.run(["scontrol", "update", f"JobId={jobid}", f"TimeLimit={limit}"], env=env, check=True, capture_output=True)
        warned = re.compile(rf"warning signal 15 to JobId={jobid}$", re.M)
        log = cluster.root / "log" / "slurmctld.log"
        deadline = time.time() + 90
        while time.time() < deadline and not record.get("warned"):
            record["warned"] = bool(warned.search(log.read_text())) and not any(_stopped(p) for p in pids)
            time.sleep(0.2)
    except Exception as exc:  # noqa: BLE001 - reported by the test that reads the record
        record["error"] = repr(exc)
    finally:
        for pid in pids:  # should Slurm not have released it
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


def _interrupt_training(cluster, work, done, stop):
    """Interrupt each run once its job runs and has logged INTERRUPT_AFTER_STEPS steps; a requeued
    job is then let start at once (Slurm holds a requeued job ~2 minutes: BeginTime). Each
    interruption (the wait for a time-limit warning, the requeue and its release) runs beside the
    loop, which goes on watching the other run: a requeue in the loop held it for tens of seconds,
    and on a fast host (hidden-96 toy, 1.6 s a step) the other training ran its 16 steps to the end
    unwatched (CI of 256a0f4)."""
    env = cluster.env()
    threads = []
    try:
        _watch_and_interrupt(cluster, work, done, stop, env, threads)
    except Exception as exc:  # noqa: BLE001 - reported by the tests that read `done`
        done["monitor error"] = repr(exc)
    for thread in threads:
        thread.join()


def _watch_and_interrupt(cluster, work, done, stop, env, threads):
    import subprocess
    import threading
    import time

    def beside(target, *args):
        def run():
            try:
                target(*args)
            except Exception as exc:  # noqa: BLE001 - reported by the tests that read `done`
                done["monitor error"] = repr(exc)

        threads.append(threading.Thread(target=run))
        threads[-1].start()

    while not stop.is_set() and not all(m in done for m in INTERRUPTED):
        running = subprocess.run(["squeue", "-h", "-t", "R", "-o", "%i|%k"], env=env, capture_output=True, text=True).stdout
        for line in running.split():
            jobid, comment = line.split("|", 1)
            method = comment.rsplit("_wildcards_tiny_qwen3_", 1)[-1]
            if method not in INTERRUPTED or method in done:
                continue
            logs = list((work / f"results/training/tiny_qwen3/{method}/checkpoints").glob("*/train_log.jsonl"))
            if not (logs and len(logs[0].read_text().splitlines()) >= INTERRUPT_AFTER_STEPS):
                continue
            if INTERRUPTED[method] == "time limit":
                done[method] = {"jobid": jobid}
                beside(_warn_by_time_limit, cluster, jobid, env, done[method])
            else:
                done[method] = jobid
                beside(_requeue_now, jobid, cluster)
        time.sleep(0.3)


def _requeue_now(jobid, cluster):
    """`scontrol requeue` a running job (Slurm's SIGTERM, then the same job id runs again), let start
    at once (Slurm holds a requeued job ~2 minutes: BeginTime)."""
    import time

    env = cluster.env()
    slurmd_log = cluster.root / "log" / "slurmd.log"
    done_before = _slurmd_done_lines(slurmd_log, jobid)
    subprocess.run(["scontrol", "requeue", jobid], env=env, check=True, capture_output=True)
    requeued_at = time.time()
    deadline = requeued_at + 120
    while time.time() < deadline and not subprocess.run(
            ["squeue", "-h", "-j", jobid, "-o", "%T"], env=env, capture_output=True, text=True).stdout.startswith("PENDING"):
        time.sleep(0.2)
    # The first run's processes may outlive its PENDING state (its step gets KillWait to end), and
    # the test Slurm tracks processes by parentage (proctrack/linuxproc: no cgroups here), so the
    # first run's own Snakemake, stuck after the SIGTERM, was left running as an orphan (CI of
    # b964458: two, 45 minutes after their jobs). A cluster's proctrack/cgroup kills every process
    # of the job once its steps end: so does this, by the job id in their environment, once Slurm's
    # own processes of the run are gone (a training saves its step on the SIGTERM) and KillWait has
    # passed. The next run starts once they are gone and slurmd has finished the run's batch script ("done with job", in its log), and a
    # few seconds more, as on a cluster, where a requeued job waits ~2 minutes. Released beside
    # them, the next run once failed at once with exit 1 on a loaded host, and once (CI of 8e2bef5)
    # failed to launch (no output): Snakemake then resubmitted it.
    while time.time() < deadline and (_job_pids(jobid, env) or _slurmd_done_lines(slurmd_log, jobid) <= done_before):
        time.sleep(0.2)
    # Slurm's KillWait (30 s) after the SIGTERM, then SIGKILL, as a cgroup's processes get
    while time.time() < requeued_at + 30 and _job_processes(jobid, cluster.cluster):
        time.sleep(0.2)
    while time.time() < deadline and (leftovers := _job_processes(jobid, cluster.cluster)):
        for pid in leftovers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)
    time.sleep(3)
    subprocess.run(["scontrol", "update", f"JobId={jobid}", "StartTime=now"], env=env, check=True, capture_output=True)


def _job_processes(jobid: str, cluster_name: str) -> list[int]:
    """This node's processes of the test cluster's job ``jobid`` by their environment
    (``SLURM_JOB_ID`` and ``SLURM_CLUSTER_NAME``: a host that itself runs in a Slurm job has another
    cluster's), Slurm's own step daemons left out: what a cgroup would hold."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes()
            command = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        environ = b"\0" + environ + b"\0"
        if (f"\0SLURM_JOB_ID={jobid}\0".encode() in environ and f"\0SLURM_CLUSTER_NAME={cluster_name}\0".encode() in environ
                and not command.startswith(b"slurmstepd") and int(proc.name) != os.getpid()):
            found.append(int(proc.name))
    return found


def _slurmd_done_lines(log: Path, jobid: str) -> int:
    """How many times slurmd has logged the batch script of job ``jobid`` done."""
    try:
        return log.read_text(errors="replace").count(f"[{jobid}.batch] done with job")
    except OSError:
        return 0


def _slurmd_lines(cluster, jobid: str) -> str:
    """slurmd's and slurmctld's log lines about job ``jobid``: why a run failed to launch."""
    about = re.compile(rf"(JobId=|job |\[|StepId=){jobid}(\D|$)", re.IGNORECASE)
    out = []
    for name in ("slurmd", "slurmctld"):
        path = cluster.root / "log" / f"{name}.log"
        if path.exists():
            out += [f"{name}: {line}" for line in path.read_text(errors="replace").splitlines() if about.search(line)]
    return "\n".join(out[-60:])


def _job_pids(jobid, env) -> list[str]:
    """The processes of Slurm job ``jobid`` on this (the only) node (`scontrol listpids`)."""
    out = subprocess.run(["scontrol", "listpids", jobid], env=env, capture_output=True, text=True)
    return [line.split()[0] for line in out.stdout.splitlines() if line.split() and line.split()[0].isdigit()]


@background.part("Slurm training interrupted", after=("Slurm diagnostic",))
def _slurm_training_interrupted():
    """The tiny run's OPSD and EOPD trainings again, through the Slurm executor on the test Slurm
    (after the diagnostic: the node has 2 CPUs), each interrupted (:data:`INTERRUPTED`)."""

    def run():
        import threading

        from slurm.cluster import SlurmUnavailable

        try:
            cluster = background.result("Slurm cluster start")
        except SlurmUnavailable:
            return None  # the fixture skips
        work = session_tmp("slurm_training")
        copy_tiny_inputs(background.result("tiny model"), work)
        shutil.copytree(REPO / "tiny" / "config", work / "config")  # the tiny run's config
        # Periodic saves only at the evaluation step: a resume from any earlier step then comes from
        # the checkpoint written on notice (however late the interruption lands on a loaded host).
        cfg_path = work / "config" / "config.yaml"
        cfg = yaml.safe_load(cfg_path.read_text())
        cfg["training"]["save_every"] = cfg["training"]["eval_step"]
        cfg["evaluation"]["sweep_steps"] = []  # swept steps must be saved steps
        cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        prof_dir = filled_profile(session_tmp("profile_training"), threads=1, account=cluster.account)
        prof = yaml.safe_load((prof_dir / "profile.yaml").read_text())
        prof["default-resources"]["cpus_per_task"] = 1
        for res in prof["set-resources"].values():
            res.update(cpus_per_task=1, mem_mb="3000 * attempt")
        (prof_dir / "profile.yaml").write_text(yaml.safe_dump(prof, sort_keys=False))
        done, stop = {}, threading.Event()
        monitor = threading.Thread(target=_interrupt_training, args=(cluster, work, done, stop), daemon=True)
        monitor.start()
        before = {job["jobid"] for job in cluster.jobs()}
        try:
            proc = run_snakemake(["--profile", str(prof_dir), "--directory", str(work),
                                  *(f"results/training/tiny_qwen3/{m}/adapter" for m in INTERRUPTED),
                                  "--slurm-init-seconds-before-status-checks", "1", "--seconds-between-status-checks", "2"],
                                 env={"SLURM_CONF": str(cluster.conf)}, check=False)
        finally:
            stop.set()
            monitor.join()
        count_jobs_cpu(cluster, before)
        return work, proc, done, cluster.jobs(all_runs=True)

    return run


@pytest.fixture(scope="module")
def slurm_training(slurm_cluster):
    return background.result("Slurm training interrupted")


@pytest.fixture(scope="module")
def slurm_training_done():
    """The interrupted trainings' working directory and jobs, read after this module's cluster may
    have stopped (the working directory is not the cluster's): for the comparison with the tiny run,
    which runs at the end of the session (conftest.py)."""
    return slurm_part("Slurm training interrupted")


def _resumed_step(log_text: str) -> int:
    found = re.findall(r"resumed from \S+/step-(\d+) \(step \d+\)", log_text)
    assert len(found) == 1, log_text[-3000:]
    return int(found[0])


@pytest.mark.workflow
def test_a_training_job_warned_by_its_time_limit_checkpoints_and_is_resubmitted(slurm_training, slurm_cluster):
    """Its limit cut after step 3 to within the profile's `--signal=TERM@600` window, the job is
    warned by slurmctld's time-limit timer (not by a test's signal), checkpoints the step in
    progress and fails with status 75 before the limit; Snakemake submits a new job (not a rerun
    inside the spent allocation), which resumes from that checkpoint, not from step 0 or the last
    save_every one (and ends as the uninterrupted run: the test after the tiny run below)."""
    work, proc, done, jobs = slurm_training
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "opsd" in done and done["opsd"].get("warned") and "error" not in done["opsd"], done
    jobid, limit_min = done["opsd"]["jobid"], done["opsd"]["limit_min"]
    runs = [j for j in jobs if j["comment"].endswith("_tiny_qwen3_opsd")]
    assert [(j["jobid"], j["state"]) for j in runs] == [(jobid, "FAILED"), (runs[1]["jobid"], "COMPLETED")], runs
    assert runs[1]["jobid"] != jobid
    # slurmctld's timer sent the warning; the job stopped on it before reaching the cut limit
    ctld = (slurm_cluster.root / "log" / "slurmctld.log").read_text()
    assert re.search(rf"send_job_warn_signal: warning signal 15 to JobId={jobid}$", ctld, re.M)
    assert runs[0]["timelimit"] == f"00:{limit_min:02d}:00" and int(runs[0]["elapsed"]) < 60 * limit_min, runs[0]
    warned = (work / "logs/slurm/rule_train/tiny_qwen3_opsd" / f"{jobid}.log").read_text()
    stopped = re.search(r"stopped on SIGTERM after step (\d+) of \d+; checkpoint step-(\d+) written", warned)
    assert stopped and stopped[1] == str(int(stopped[2])) and warned.count("Trying to restart job") == 0, warned[-3000:]
    save_every = yaml.safe_load((work / "config/config.yaml").read_text())["training"]["save_every"]
    step = _resumed_step((work / "logs/train/tiny_qwen3/opsd.log").read_text())
    assert step == int(stopped[1]) and INTERRUPT_AFTER_STEPS <= step < save_every  # not a periodic save's step


@pytest.mark.workflow
def test_a_training_job_requeued_by_slurm_resumes_under_its_job_id(slurm_training):
    """`scontrol requeue` after step 3: Slurm's SIGTERM makes the job checkpoint the step in
    progress, the same job id runs again (SLURM_RESTART_COUNT=1; the executor plugin waits on a
    REQUEUED job), resumes from that checkpoint (and ends as the uninterrupted run: the test
    after the tiny run below)."""
    work, proc, done, jobs = slurm_training
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "eopd" in done and "monitor error" not in done, done
    runs = [j for j in jobs if j["comment"].endswith("_tiny_qwen3_eopd")]
    assert [(j["jobid"], j["state"]) for j in runs] == [(done["eopd"], "REQUEUED"), (done["eopd"], "COMPLETED")], runs
    log = (work / "logs/train/tiny_qwen3/eopd.log").read_text()
    assert f"Slurm job {done['eopd']} restarted (restart 1)" in log, log[-3000:]
    save_every = yaml.safe_load((work / "config/config.yaml").read_text())["training"]["save_every"]
    step = _resumed_step(log)
    assert INTERRUPT_AFTER_STEPS <= step < save_every  # not a periodic save's step


@pytest.mark.workflow
def test_the_warned_and_the_requeued_slurm_trainings_end_as_the_uninterrupted_runs(slurm_training_done, tiny_run):
    """Each resumed training (OPSD warned by its time limit, EOPD requeued) ends with the tiny run's
    adapter and step log for that method, bit for bit."""
    (work, proc, done, jobs), (tiny, _) = slurm_training_done, tiny_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    for method in ("opsd", "eopd"):
        _assert_same_run(work, tiny, method)


def _assert_same_run(work, tiny, method):
    import json

    run = Path("results/training/tiny_qwen3") / method
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        assert (work / run / "adapter" / name).read_bytes() == (tiny / run / "adapter" / name).read_bytes(), name
    strip = lambda path: [{k: v for k, v in json.loads(x).items() if not k.endswith("seconds")}  # noqa: E731
                          for x in path.read_text().splitlines()]
    assert strip(work / run / "train_log.jsonl") == strip(tiny / run / "train_log.jsonl")


def test_a_restarted_job_says_so_from_its_environment_or_from_scontrol():
    from pwopsd.cluster import restarts_of, slurm_restart

    shown = "JobId=7 JobName=x UserId=root(0) Restarts=2 BatchFlag=1 Reboot=0 ExitCode=0:0"
    assert restarts_of(shown) == "2" and restarts_of("JobId=7 Reboot=0") is None and restarts_of(None) is None
    assert slurm_restart({}) is None  # not a Slurm job
    assert slurm_restart({"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "0"}) is None
    assert slurm_restart({"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "1"}, show_job=lambda j: 1 / 0).startswith(
        "Slurm job 7 restarted (restart 1)")
    # inside a Snakemake job step the variable is gone: scontrol tells
    assert slurm_restart({"SLURM_JOB_ID": "7"}, show_job=lambda j: shown if j == "7" else "").startswith(
        "Slurm job 7 restarted (restart 2)")
    assert slurm_restart({"SLURM_JOB_ID": "7"}, show_job=lambda j: shown.replace("Restarts=2", "Restarts=0")) is None
    assert slurm_restart({"SLURM_JOB_ID": "7"}, show_job=lambda j: None) is None


def test_training_jobs_are_warned_before_their_limit_requeued_and_retried_as_the_cost_plan_says(tmp_path):
    """The profile asks Slurm for SIGTERM ten minutes before a training job's limit (a notice that
    pwopsd.notice turns into a checkpoint), the job learns that window (resource notice_window_s,
    torchrun's shutdown timeout) and asks for --requeue; the train rule's retries are the cost
    plan's attempts under the profile's limits, and a limit too short is refused."""
    from pwopsd.notice import NOTICE_GRACE_SECONDS

    prof = profile()
    assert prof["set-resources"]["train"]["slurm_extra"] == f"'--signal=TERM@{NOTICE_GRACE_SECONDS}'"
    assert prof["slurm-requeue"] is True
    work = tmp_path / "work"
    shutil.copytree(REPO / "config", work / "config")
    cfg_path = work / "config" / "config.yaml"
    cfg_path.write_text(cfg_path.read_text().replace("max_runtime_min: 2880", "max_runtime_min: 120"))
    proc = run_snakemake(["-n", "--profile", str(filled_profile(tmp_path)), "--directory", str(work),
                          "results/training/qwen3_4b/opsd/adapter"])
    train = re.search(r"rule train:(?:\n    [^\n]*)*?\n    resources: ([^\n]*)", proc.stdout + proc.stderr)[1]
    assert "slurm_extra=--signal=TERM@600" in train
    assert "notice_window_s=600," in train  # torchrun's --shutdown-timeout in the job: the same window
    cfg_path.write_text(cfg_path.read_text().replace("max_runtime_min: 120", "max_runtime_min: 12"))
    proc = run_snakemake(["--profile", str(filled_profile(tmp_path / "p2")), "--directory", str(work),
                          "results/training/qwen3_4b/opsd/adapter"], check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "the partition's time limit is too short" in out, out[-2000:]
    assert "cluster.max_runtime_min=12 is too short for training qwen3_4b/opsd" in out
    assert not (work / "results").exists()



# Time-limit warnings of the jobs that stop on notice (docs/cluster.md, "Notice windows").


def _rules_that_stop_on_notice():
    """Rules whose script stops on notice (it uses pwopsd.notice's exit_on_notice), read from the
    workflow's own files: each rule's `script:`, and the rules made from them with `use rule ... as`."""
    scripts = {p.name for p in (REPO / "workflow" / "scripts").glob("*.py") if "exit_on_notice" in p.read_text()}
    rules, copies = {}, []
    for smk in (REPO / "workflow" / "rules").glob("*.smk"):
        text = smk.read_text()
        for block in re.split(r"\n(?=rule \w+:)", text):
            name = re.match(r"rule (\w+):", block)
            script = re.search(r'^\s+script:\s*\n\s+"\.\./scripts/([\w.]+)"', block, re.M)
            if name and script:
                rules[name[1]] = script[1]
        copies += re.findall(r"use rule (\w+) as (\w+) with:", text)
    for source, copy in copies:
        if source in rules:
            rules[copy] = rules[source]
    return {rule for rule, script in rules.items() if script in scripts}


def test_every_rule_that_stops_on_notice_is_warned_by_its_profile_entry_with_room_for_its_work():
    """Each rule whose jobs stop on notice asks Slurm for SIGTERM to the job step (`'--signal=TERM@N'`,
    quoted as the profile writes slurm_extra) N seconds before its limit, N at least what its longest
    paper job needs (the cost model's figure); no other rule is warned (it would only end early)."""
    from pwopsd import cost
    from pwopsd.config import load_config

    stopping = _rules_that_stop_on_notice()
    assert {"train", "generate", "grade", "spines", "forced_continuation"} <= stopping
    assert stopping == set(cost.NOTICE_KINDS), stopping ^ set(cost.NOTICE_KINDS)  # the window check covers them all
    paper = load_config(REPO / "config" / "config.yaml")
    resources = profile()["set-resources"]
    for rule in stopping:
        extra = resources[rule]["slurm_extra"]
        found = re.fullmatch(r"'--signal=TERM@(\d+)'", extra)
        assert found, (rule, extra)
        need = cost.needed_window(rule, paper)
        assert int(found[1]) >= need.seconds, (rule, int(found[1]), need.explain())
    for rule, res in resources.items():
        if rule not in stopping:
            assert "--signal" not in str(res.get("slurm_extra", "")), rule
    # the sweep-step copies ask for what their rules ask for
    assert resources["generate_sweep_step"] == resources["generate"] and resources["grade_sweep_step"] == resources["grade"]


def _with_extra(tmp_path, changes):
    """A filled-in profile with the slurm_extra of some rules replaced (None: removed)."""
    d = filled_profile(tmp_path)
    prof = yaml.safe_load((d / "profile.yaml").read_text())
    for rule, extra in changes.items():
        prof["set-resources"][rule] = {**prof["set-resources"][rule]}
        if extra is None:
            prof["set-resources"][rule].pop("slurm_extra")
        else:
            prof["set-resources"][rule]["slurm_extra"] = extra
    (d / "profile.yaml").write_text(yaml.safe_dump(prof, sort_keys=False))
    return d


@pytest.mark.long
def test_a_warning_that_cannot_hold_its_work_is_refused_at_start_naming_the_setting(tmp_path):
    """Shrunk in the profile, given on the command line (--set-resources: what sbatch would get), or
    outgrown by a longer training.max_completion_length: the dry run stops before any job, naming
    the rule's set-resources.<rule>.slurm_extra and the seconds it needs; a run submits nothing."""
    work = tmp_path / "work"
    shutil.copytree(REPO / "config", work / "config")
    shrunk = _with_extra(tmp_path / "p1", {"generate": "'--signal=TERM@60'"})
    proc = run_snakemake(["-n", "--profile", str(shrunk), "--directory", str(work), "results/tables/main_4b.tex"], check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Job stats" not in out, out[-3000:]
    found = re.search(r"set-resources\.generate\.slurm_extra warns generate jobs 60 s before their time limit, too short "
                      r"for \w+: one generation shard .* raise N in '--signal=TERM@N' to at least (\d+)", out)
    assert found and int(found[1]) > 60, out[-3000:]
    proc = run_snakemake(["--profile", str(shrunk), "--directory", str(work), "results/tables/main_4b.tex"], check=False)
    assert proc.returncode != 0 and "set-resources.generate.slurm_extra warns" in proc.stdout + proc.stderr
    assert not (work / "results").exists() and not (work / "logs").exists()
    # what the command line's --set-resources gives is what sbatch gets, and is checked too (it replaces the
    # profile's set-resources as a whole: the train rule's warning goes with them)
    proc = run_snakemake(["-n", "results/tables/main_4b.tex", "--profile", str(filled_profile(tmp_path / "p2")),
                          "--directory", str(work), "--set-resources", "grade:slurm_extra='--signal=TERM@30'"], check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "set-resources.grade.slurm_extra warns grade jobs 30 s" in out, out[-3000:]
    assert "set-resources.train.slurm_extra asks for no warning" in out
    # longer rollouts: the longest alone, decoded at one engine's single-stream speed on the 8B model, outlasts 600 s
    from pwopsd.cost import ASSUMPTIONS as a

    length = 16384
    longest = length / (a["stream_tok_s_4b"] * 4 / 8 * a["stream_gain_tp1"])
    window = int(re.search(r"TERM@(\d+)", profile()["set-resources"]["train"]["slurm_extra"])[1])
    assert a["notice_safety"] * longest > window
    overlay = tmp_path / "long_rollouts.yaml"
    overlay.write_text(yaml.safe_dump({"training": {"max_completion_length": length}}))
    proc = run_snakemake(["-n", "results/tables/main_4b.tex", "--profile", str(filled_profile(tmp_path / "p3")),
                          "--directory", str(work), "--configfile", "config/config.yaml", str(overlay)], check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert re.search(rf"set-resources\.train\.slurm_extra warns train jobs {window} s before their time limit, too short "
                     r"for dsr1_llama_8b/\w+: one training step", out), out[-3000:]


def test_a_warning_missing_or_of_another_signal_is_refused_naming_the_setting(tmp_path):
    """No warning for a rule that stops on notice (it would lose its piece in progress at the kill),
    SIGUSR1 (the job step's Snakemake dies of it) or `B:` (only the batch shell hears it)."""
    from pwopsd.cluster import Profile
    from pwopsd.config import load_config
    from pwopsd.cost import window_problems

    paper = load_config(REPO / "config" / "config.yaml")
    changes = {"spines": None, "forced_continuation": "'--signal=USR1@900'", "grade": "'--signal=B:TERM@2400'"}
    prof = Profile.from_file(_with_extra(tmp_path, changes) / "profile.yaml")
    problems = window_problems(paper, prof)
    assert len(problems) == 3, problems
    assert any("set-resources.spines.slurm_extra asks for no warning" in p for p in problems)
    assert any("set-resources.forced_continuation.slurm_extra asks for --signal=USR1@900" in p for p in problems)
    assert any("set-resources.grade.slurm_extra asks for --signal=B:TERM@2400" in p for p in problems)
    assert window_problems(paper, Profile.from_file()) == []  # the profile as shipped
    # the check covers the rules the workflow has: without the diagnostic, spines is not asked about
    assert len(window_problems(paper, prof, rules={"train", "generate", "grade"})) == 1


# -- watching the runs: python -m pwopsd.status ------------------------------------------------

def _status_cli(work, targets, cluster, *extra):
    """`python -m pwopsd.status` on a run of the test Slurm: its JSON and its terminal output."""
    out = work / f"status-{len(list(work.glob('status-*.json')))}.json"
    proc = subprocess.run([sys.executable, "-m", "pwopsd.status", "--directory", str(work), *targets, "--json", str(out),
                           *extra], capture_output=True, text=True, env=cluster.env(), cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


def _job(status, rule):
    (job,) = [j for j in status["jobs"] if j["rule"] == rule]
    return job


@pytest.mark.workflow
def test_the_status_command_shows_the_slurm_diagnostic_its_failure_and_its_spend(slurm_run, slurm_cluster):
    """During the run the status showed jobs running on Slurm beside done and waiting ones; after
    it, every job is done, the failure (candidates, killed for its memory) is shown with its Slurm
    state, exit code, attempt and its log's last lines, followed by its resubmission, and the job
    requeued while it ran with its two runs, counted as a resubmission; the GPU-hours spent are
    Slurm's accounting (elapsed x allocated GPUs) next to the cost plan's."""
    from pwopsd import cost
    from pwopsd.config import load_config_files

    work, proc, jobs, snapshots, requeued = slurm_run
    assert proc.returncode == 0
    errors = [s for s in snapshots if isinstance(s, str)]
    assert not errors, errors
    total = len(snapshots[-1].jobs)
    running = [s for s in snapshots if s.counts()["running"] and s.counts()["done"] < total]
    assert running, [s.counts() for s in snapshots]
    slurm_ids = {j["jobid"] for j in jobs}
    for snap in running:
        assert sum(snap.counts().values()) == total
        for job in snap.jobs:
            if job.state == "running":  # a real job of the cluster, in its running attempt
                assert job.attempts[-1].slurm_jobid in slurm_ids and job.attempts[-1].state == "RUNNING", job
    status, shown = _status_cli(work, DIAGNOSTIC_TARGETS, slurm_cluster, "--plan-vs-spent")
    assert status["counts"] == {"done": total, "running": 0, "queued": 0, "failed": 0, "waiting": 0}
    assert status["accounting"] == "sacct"
    # the failure, with its reason, and its resubmission
    first, second = jobs_by_rule(jobs)["candidates"]
    candidates = _job(status, "candidates")
    failed, retried = candidates["attempts"]
    assert (failed["slurm_jobid"], failed["state"], retried["slurm_jobid"], retried["state"]) == (
        first["jobid"], first["state"], second["jobid"], "COMPLETED")
    assert failed["reason"].startswith("out of memory") and failed["exit_code"] == first["exit"]
    assert any("exceeded job memory limit" in line.lower() for line in failed["log_tail"]), failed
    assert "out of memory" in shown and first["jobid"] in shown
    # the job interrupted while it ran: requeued by Slurm, run again under its job id
    (jobid,) = requeued
    attempts = _job(status, REQUEUED_RULE)["attempts"]
    assert len(attempts) == 2, ([(a["slurm_jobid"], a["state"], a["exit_code"], a["reason"], a["log_tail"]) for a in attempts],
                                _slurmd_lines(slurm_cluster, jobid))
    interrupted, resumed = attempts
    assert (interrupted["slurm_jobid"], interrupted["state"], resumed["slurm_jobid"], resumed["state"]) == (
        jobid, "REQUEUED", jobid, "COMPLETED")
    assert interrupted["reason"].startswith("requeued by Slurm") and resumed["resubmitted_after_notice"]
    assert sorted((j["rule"], len(j["attempts"])) for j in status["jobs"] if any(a["reason"] for a in j["attempts"])) == [
        ("candidates", 2), (REQUEUED_RULE, 2)]
    assert "resubmitted after a notice or requeue: 1" in shown
    # spend: Slurm's accounting against the plan
    cfg = load_config_files([work / "config" / "config.yaml"])
    every_run = jobs_by_rule(slurm_cluster.jobs(all_runs=True))  # a requeued job's runs too
    for rule, gpus in (("spines", 2), ("forced_continuation", 2), ("teacher_pass", 1), ("mc_dropout", 1)):
        job = _job(status, rule)
        assert job["gpus"] == gpus and all(a["gpus"] == gpus for a in job["attempts"])
        spent = sum(a["seconds"] * a["gpus"] for a in job["attempts"]) / 3600
        assert spent == pytest.approx(sum(int(run["elapsed"]) for run in every_run[rule]) * gpus / 3600)
        planned = cost.job_hours(cost.Job(rule, job["wildcards"], gpus), cfg) * gpus
        assert job["planned_gpu_hours"] == pytest.approx(planned) and planned > 0
    rows = {r["rule"]: r for r in status["spend"]}
    assert rows["spines"]["spent_gpu_hours"] == pytest.approx(int(jobs_by_rule(jobs)["spines"][0]["elapsed"]) * 2 / 3600)
    assert "Planned against spent" in shown


@pytest.mark.workflow
def test_a_cost_overlay_fitted_to_the_slurm_diagnostic_prices_it_closer(slurm_run, slurm_cluster, tmp_path):
    """--fit-overlay on the finished run: the overlay's assumptions price its GPU jobs closer to what
    they cost than the assumptions in force, and the cost plan reads it."""
    from pwopsd import cost
    from pwopsd.config import load_config_files
    from pwopsd.status import collect
    from pwopsd.status import fit as fitmod

    work = slurm_run[0]
    overlay = tmp_path / "fitted.yaml"
    _, shown = _status_cli(work, DIAGNOSTIC_TARGETS, slurm_cluster, "--fit-overlay", str(overlay))
    assert f"wrote {overlay}" in shown
    fitted = load_config_files([work / "config" / "config.yaml", overlay])
    base = load_config_files([work / "config" / "config.yaml"])
    # a toy's jobs are mostly start-up: the start-up is corrected at least (the throughputs: the
    # planted-value test in tests/test_status.py)
    assert "startup_min" in fitted["cluster"]["cost_assumptions"]
    assert cost.assumptions(fitted)["startup_min"] < cost.assumptions(base)["startup_min"]
    data = fitmod.samples(collect(work, DIAGNOSTIC_TARGETS, env=slurm_cluster.env()))
    assert {s.job.rule for s in data} == {"spines", "forced_continuation", "teacher_pass", "mc_dropout"}
    assert fitmod.residual(data, fitted, cost.assumptions(fitted)) < fitmod.residual(data, base, cost.assumptions(base))


@pytest.mark.workflow
def test_the_status_command_counts_resubmissions_after_a_notice_and_a_requeue(slurm_training, slurm_cluster):
    """The training run warned by its time limit (stopped on notice, exit 75) and resubmitted, and
    the one requeued by Slurm: each shown with its two attempts, the first's reason, the second
    counted as a resubmission after a notice."""
    work, proc, done, jobs = slurm_training
    assert proc.returncode == 0
    targets = [f"results/training/tiny_qwen3/{m}/adapter" for m in INTERRUPTED]
    status, shown = _status_cli(work, targets, slurm_cluster)
    assert status["counts"]["done"] == len(status["jobs"]) and status["counts"]["failed"] == 0
    by_method = {j["wildcards"].get("method"): j for j in status["jobs"] if j["rule"] == "train"}
    notice, after = by_method["opsd"]["attempts"]
    (warned,) = [j for j in slurm_cluster.jobs(all_runs=True) if j["jobid"] == done["opsd"]["jobid"]]
    assert (notice["slurm_jobid"], notice["state"], notice["exit_code"], after["state"]) == (
        warned["jobid"], warned["state"], warned["exit"], "COMPLETED")
    assert notice["reason"].startswith("stopped on notice") and after["resubmitted_after_notice"]
    assert notice["log"].endswith(f"{warned['jobid']}.log")
    assert any(line.startswith("pwopsd job stopped on notice: stopped on SIGTERM after step") for line in notice["log_tail"])
    requeued, again = by_method["eopd"]["attempts"]
    assert (requeued["slurm_jobid"], requeued["state"], again["slurm_jobid"], again["state"]) == (
        done["eopd"], "REQUEUED", done["eopd"], "COMPLETED")
    assert requeued["reason"].startswith("requeued by Slurm") and again["resubmitted_after_notice"]
    assert "resubmitted after a notice or requeue: 2" in shown


def _rgb(hex_color):
    return tuple(int(hex_color[i:i + 2], 16) for i in (1, 3, 5))


@pytest.mark.workflow
def test_the_status_page_rendered_by_chromium_shows_progress_and_spend(slurm_run, chromium, tmp_path):
    """The HTML page of the Slurm diagnostic while it ran, rendered by headless Chromium: the
    screenshot holds the progress bar in the proportions of the job counts, and the planned and
    spent GPU-hour bars."""
    from PIL import Image

    from pwopsd.status import render

    snapshots = [s for s in slurm_run[3] if not isinstance(s, str)]
    # the snapshot with the most kinds of jobs in it (done, running, waiting, ...), the latest of those
    snap = max(reversed(snapshots), key=lambda s: (sum(1 for n in s.counts().values() if n), s.counts()["done"]))
    page = tmp_path / "status.html"
    page.write_text(render.page(snap))
    assert "<script" not in page.read_text() and "http" not in page.read_text().replace("http://www.w3.org/2000/svg", "")
    png = tmp_path / "status.png"
    screenshot(chromium, page, png, tmp_path / "chromium-profile")
    image = Image.open(png).convert("RGB")
    pixels = image.load()
    width, height = image.size
    counts = snap.counts()
    # the first row of the page wider than the legend's squares in progress colours is the run's own
    # bar: its parts in proportion
    colours = {s: _rgb(render.COLORS[s]) for s in counts}

    def shares(y):
        return {s: sum(1 for x in range(width) if pixels[x, y] == c) for s, c in colours.items()}

    run_bar = next(bar for bar in map(shares, range(height)) if sum(bar.values()) > 100)
    bar = sum(run_bar.values())
    assert 300 <= bar <= 322, run_bar  # the 320-px bar
    for state, n in counts.items():
        assert abs(run_bar[state] - bar * n / len(snap.jobs)) <= 2, (run_bar, counts)
    everywhere = {name: sum(1 for y in range(0, height, 2) for x in range(0, width, 2) if pixels[x, y] == _rgb(color))
                  for name, color in render.COLORS.items()}
    assert everywhere["planned"] > 20 and everywhere["spent"] > 20, everywhere  # the spend chart's bars
    assert counts["done"] and counts["running"] + counts["queued"] and len(snap.jobs) > counts["done"], counts


def test_the_preflight_asks_slurm_for_every_gpu_request_and_names_a_gres_type_it_refuses(slurm_cluster, tmp_path):
    """On the test Slurm (GRES gpu:h100:4, partitions gpu and cpu): the paper config's GPU rules with
    the profile filled in are each accepted by sbatch itself (--test-only); the GRES type a site with
    NVML autodetect names (nvidia_h100_80gb_hbm3) is refused for every one of them, naming the
    setting and the partition's real types; a partition Slurm lacks and a time limit shorter than
    cluster.max_runtime_min are named too."""
    from pwopsd.config import load_config
    from pwopsd.preflight import slurm_findings

    cfg = load_config(REPO / "config" / "config.yaml")
    prof = yaml.safe_load((filled_profile(tmp_path, account=slurm_cluster.account) / "profile.yaml").read_text())
    env = slurm_cluster.env()
    gpu_rules = GPU_RULES | {"generate_sweep_step"}
    # The profile's sizes (32 CPUs and 256 GB for a generate job) against this node's, as scontrol
    # reports them: every rule asking for more is refused by sbatch, naming the rule's resources.
    node = dict(kv.split("=", 1) for kv in subprocess.run(["scontrol", "show", "node", "-o"], env=env, capture_output=True,
                                                           text=True, check=True).stdout.split() if "=" in kv)
    cpus, memory = int(node["CPUTot"]), int(node["RealMemory"])
    paper = slurm_findings(prof, cfg, env=env)
    assert all(f.ok for f in paper if f.check != "job size"), [f.message for f in paper if not f.ok]
    assert {f.message.split(":")[0] for f in paper if f.check == "GRES"} == {f"rule {r}" for r in gpu_rules}
    sizes = {"default": prof["default-resources"], **prof["set-resources"]}
    too_big = {r for r, res in sizes.items() if int(res.get("cpus_per_task", 2)) > cpus
               or int(str(res.get("mem_mb", 8000)).split()[0]) > memory}
    assert too_big >= gpu_rules  # 2-core test node
    refused = {f.message.split("'s jobs")[0].removeprefix("sbatch refuses rule ") for f in paper if not f.ok}
    assert refused == too_big, (refused, too_big)
    assert all("cpus_per_task / mem_mb / runtime" in f.setting for f in paper if not f.ok)
    for res in sizes.values():  # the profile sized for this node: every request accepted
        res.update(cpus_per_task=1, mem_mb=500)
    good = slurm_findings(prof, cfg, env=env)
    assert all(f.ok for f in good), [f.message for f in good if not f.ok]
    assert {f.message.split(":")[0] for f in good if f.check == "job size"} == {f"rule {r}" for r in sizes}
    for res in prof["set-resources"].values():
        if "gpu_model" in res:
            res["gpu_model"] = "nvidia_h100_80gb_hbm3"
    refused = [f for f in slurm_findings(prof, cfg, env=env) if f.check == "GRES"]
    assert refused and not any(f.ok for f in refused)
    assert {f.setting.split(": ")[1].split(" ")[0] for f in refused} == {f"set-resources.{r}.gpu_model" for r in gpu_rules}
    assert all("GPU types: h100" in f.message for f in refused)
    prof["set-resources"]["train"]["slurm_partition"] = "h100q"
    (missing,) = [f for f in slurm_findings(prof, cfg, env=env) if f.check == "partition" and not f.ok]
    assert "partition h100q does not exist" in missing.message
    short = subprocess.run(["scontrol", "update", "PartitionName=cpu", "MaxTime=60"], env=env, capture_output=True)
    try:
        assert short.returncode == 0, short.stderr
        (limit,) = [f for f in slurm_findings(prof, cfg, env=env) if f.check == "time limit"]
        assert limit.setting == "cluster.max_runtime_min" and "cpu allows 60 min" in limit.message
    finally:
        subprocess.run(["scontrol", "update", "PartitionName=cpu", "MaxTime=INFINITE"], env=env, check=True)


def test_the_canary_runs_the_preflight_before_any_job_and_stops_naming_what_fails(tmp_path):
    """config/smoke.yaml sets cluster.preflight: a Slurm run then runs the preflight's login-node
    checks first and stops before any job, naming each failure and its setting (here: no Slurm to
    ask, jobs without conda environments, no Hub to read the models' config.json from)."""
    work = tmp_path / "work"
    shutil.copytree(REPO / "config", work / "config")
    assert yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())["cluster"]["preflight"] is True
    proc = run_snakemake(["results/data/benchmarks/math500.parquet", "--profile", str(filled_profile(tmp_path)),
                          "--directory", str(work), "--configfile", str(work / "config" / "smoke.yaml")],
                         env={"PATH": "/usr/bin:/bin:" + str(Path(sys.executable).parent)}, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "the preflight failed before any job" in out, out[-3000:]
    assert "-> change: software-deployment-method" in out and "config.json of Qwen/Qwen3-4B cannot be read" in out
    assert not (work / "results").exists() and not (work / "logs").exists()


def test_the_preflight_gpu_job_checks_the_nodes_driver_against_each_environment(slurm_cluster, tmp_path, monkeypatch):
    """`python -m pwopsd.preflight --gpu-job`: a one-GPU job of the train rule's partition and GPU
    type (sbatch --wait) runs the node's part and hands back its findings; the test node has no
    NVIDIA driver, so each job environment's CUDA is a failure naming it."""
    from pwopsd.config import load_config
    from pwopsd.preflight import JOB_ENVS, gpu_job_findings

    cfg = load_config(REPO / "config" / "config.yaml")
    prof = yaml.safe_load((filled_profile(tmp_path, account=slurm_cluster.account) / "profile.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    found = gpu_job_findings(prof, cfg, env=slurm_cluster.env(), timeout_s=300, sync_dir="$TMPDIR")
    # the node-local sync folder measured in the job, where $TMPDIR is the job's
    sync = [f for f in found if f.check.startswith("sync")]
    assert {f.check for f in sync} == {"sync folder", "sync speed"} and all(f.message.startswith("on GPU node ") for f in sync)
    found = [f for f in found if f not in sync]
    assert [f.check for f in found] == ["driver"] * len(JOB_ENVS), [f.message for f in found]
    assert not any(f.ok for f in found) and all("no driver found" in f.message for f in found)
    assert {f.message.split(" needs")[0] for f in found} == set(JOB_ENVS)
    assert not list(tmp_path.glob(".pwopsd-preflight-node-*"))  # its files are gone
