"""The Slurm profile, tested without a cluster.

* `--profile slurm` resolves from the repository root and dry-runs every paper target, GPU rules
  asking for `gpu_model=h100` with the model entry's GPU count, CPU rules for none;
* every rule named in the profile exists (Snakemake ignores unknown names silently);
* the tiny workflow's diagnostic Phases A-E run through the real Slurm executor plugin with fake
  `sbatch`/`sacct`/`srun`/... shims (tests/fakeslurm/bin) on PATH; the recorded sbatch calls
  carry `--gpus=h100:N` on GPU rules only, `--cpus-per-task`, the account and partition, and a
  job that fails is resubmitted with larger runtime and memory;
* `snakemake --lint` passes.
"""

import os
import re
import shlex
import shutil

import pandas as pd
import pytest
import yaml

from conftest import REPO, run_snakemake
from pwopsd.cluster import capped_runtimes
from pwopsd.cost import parse_dry_run

PROFILE = REPO / "profiles" / "slurm" / "profile.yaml"
FAKE_BIN = REPO / "tests" / "fakeslurm" / "bin"
PAPER_TARGETS = ["results/tables/main_4b.tex", "results/tables/schedules_4b.tex", "results/tables/cross_model.tex",
                 "results/tables/ablation_4b.tex", "results/tables/branch_auroc.tex", "results/figures/branch_auroc.pdf",
                 "results/figures/pwopsd_schedules.pdf", "all"]
GPU_RULES = {"generate", "train", "spines", "teacher_pass", "mc_dropout", "forced_continuation"}


def profile():
    return yaml.safe_load(PROFILE.read_text())


def filled_profile(tmp_path, *, threads=None):
    """The user's one-file edit: a copy of the profile with the CHANGE_ME values set."""
    text = (PROFILE.read_text().replace("CHANGE_ME_ACCOUNT", "myacct").replace("CHANGE_ME_CPU_PARTITION", "cpu")
            .replace("CHANGE_ME_GPU_PARTITION", "gpu"))
    prof = yaml.safe_load(text)
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
                "CHANGE_ME_CPU_PARTITION", "set-resources.generate.slurm_partition is CHANGE_ME_GPU_PARTITION"):
        assert f"profiles/slurm/profile.yaml: {key}" in out, out[-2000:]
    assert not (work / "results").exists() and not (work / "logs").exists()  # not even a local job ran


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


def test_lint_passes():
    proc = run_snakemake(["--lint"], check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def fake_slurm_run(tiny_run, tmp_path_factory):
    """The tiny diagnostic's GPU and CPU phases (A-E) through the real Slurm executor on fake Slurm.

    The working directory starts from the finished tiny run without the diagnostic's outputs;
    the tiny model entry asks for GPUs (2 for generation, 1 for forwards: the HF backend still
    runs on the CPU), as a paper model would; the user's one-file edit of the profile (account,
    partition) is applied to a copy, whose thread counts are set to 1 for this 2-core machine.
    The first submission of `candidates` fails, as a job killed for its limits would.
    """
    source, _ = tiny_run
    work = tmp_path_factory.mktemp("slurm_work")
    shutil.copytree(source / "results" / "data", work / "results" / "data")
    shutil.copytree(source / "results" / "models", work / "results" / "models")
    config = yaml.safe_load((REPO / "tiny" / "config" / "config.yaml").read_text())
    config["models"]["tiny_qwen3"]["gpus"] = {"generate": 2, "train": 0, "forward": 1}
    config["models"]["tiny_qwen3"]["vllm"] = {"tensor_parallel_size": 2}
    (work / "config").mkdir()
    (work / "config" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    # This machine has 2 cores, not a node's 32: one thread per job, or two concurrent jobs
    # oversubscribe the cores many times over (the sbatch flags come from set-resources).
    prof_dir = filled_profile(tmp_path_factory.mktemp("profile"), threads=1)
    state = tmp_path_factory.mktemp("fake_slurm_state")
    env = {"PATH": f"{FAKE_BIN}{os.pathsep}{os.environ['PATH']}", "FAKE_SLURM_STATE": str(state),
           "FAKE_SLURM_FAIL_ONCE": "candidates"}
    targets = [f"results/diagnostic/tiny_qwen3/{name}.parquet" for name in ("mc_dropout", "forced_continuations")]
    proc = run_snakemake(["--profile", str(prof_dir), "--directory", str(work), *targets,
                          "--slurm-init-seconds-before-status-checks", "1", "--seconds-between-status-checks", "2"],
                         env=env, check=False)
    calls = [shlex.split(line) for line in (state / "sbatch_calls.log").read_text().splitlines()] \
        if (state / "sbatch_calls.log").exists() else []
    return work, state, proc, calls


def sbatch_by_rule(calls):
    out = {}
    for args in calls:
        comment = args[args.index("--comment") + 1]
        out.setdefault(comment.removeprefix("rule_").split("_wildcards_")[0], []).append(" ".join(args))
    return out


@pytest.mark.workflow
def test_tiny_diagnostic_runs_through_the_slurm_executor(fake_slurm_run):
    work, state, proc, calls = fake_slurm_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    mc = pd.read_parquet(work / "results/diagnostic/tiny_qwen3/mc_dropout.parquet")
    cont = pd.read_parquet(work / "results/diagnostic/tiny_qwen3/forced_continuations.parquet")
    assert len(mc) > 0 and len(cont) == 18 * len(mc)
    assert set(sbatch_by_rule(calls)) == {"spines", "teacher_pass", "candidates", "mc_dropout", "forced_continuation"}
    assert not (state / "srun_calls.log").read_text().count("--gpus=h100")  # inner srun gets a plain count


@pytest.mark.workflow
def test_sbatch_flags_gpus_only_on_gpu_rules(fake_slurm_run):
    _, state, _, calls = fake_slurm_run
    by_rule = sbatch_by_rule(calls)
    expected_gpus = {"spines": 2, "forced_continuation": 2, "teacher_pass": 1, "mc_dropout": 1}
    for rule, lines in by_rule.items():
        for line in lines:
            assert "-A myacct" in line and f"-p {'gpu' if rule in expected_gpus else 'cpu'}" in line, line
            assert re.search(r"--cpus-per-task=\d+", line), line
            gpus = re.findall(r"--gpus=(\S+)", line)
            if rule in expected_gpus:
                assert gpus == [f"h100:{expected_gpus[rule]}"], line
            else:
                assert gpus == [], line
    assert "--cpus-per-task=32" in by_rule["spines"][0] and "--cpus-per-task=8" in by_rule["mc_dropout"][0]
    assert "--cpus-per-task=2" in by_rule["candidates"][0]
    srun = (state / "srun_calls.log").read_text()
    assert "--gpus=2" in srun and "--gpus=1" in srun


@pytest.mark.workflow
def test_failed_job_is_resubmitted_with_larger_limits(fake_slurm_run):
    _, _, proc, calls = fake_slurm_run
    first, second = sbatch_by_rule(calls)["candidates"]
    assert "-t 30" in first and "--mem 32000" in first
    assert "-t 60" in second and "--mem 64000" in second
