"""Rule params: the pure derivations of pwopsd.settings on the paper config, and the one idiom
rules use to reach them."""

import re
from types import SimpleNamespace as W

import pytest

from conftest import PAPER_MODELS, REPO, job_counts, run_snakemake
from pwopsd import settings
from pwopsd.config import load_config, runs_in_tables, training_runs


@pytest.fixture(scope="module")
def paper():
    return load_config(REPO / "config" / "config.yaml")


def test_model_and_evaluation_params(paper):
    wc = W(model="dsr1_llama_8b", seed="main", benchmark="aime2024")
    assert settings.hub_model(paper, wc) == {"hf_id": paper["models"]["dsr1_llama_8b"]["hf_id"],
                                             "revision": paper["models"]["dsr1_llama_8b"]["revision"]}
    assert settings.chat_template(paper, wc)["add_special_tokens"] is True
    assert settings.gpus(paper, wc, "train") == 4 and settings.dtype(paper, wc) == "bfloat16"
    assert settings.generation_seeds(paper, wc) == {"main": None} and settings.generation_seeds(paper, W(seed="2")) == {"2": 2}
    assert settings.sampling(paper, wc)["n"] == 12 and settings.benchmarks(paper) == list(paper["benchmarks"])
    assert settings.grading(paper) == {
        "timeout": 5, "maj_budget": 120, "verdicts": "reference",
        "graders": {"reference": {"string_fallback": "exception", "gold_wrapping": "dollar", "empty_box": "placeholder"},
                    "corrected": {"string_fallback": "parse_failure", "gold_wrapping": "boxed", "empty_box": "empty"}}}
    assert settings.benchmark_entry(paper, wc)["expected_rows"] == 30


def test_training_params_take_the_model_entrys_lora_targets(paper):
    run = settings.training_run(paper, W(model="qwen3_4b", method="pwopsd_moderate"))
    assert run["lora_targets"] == paper["training"]["lora"]["targets"] and run["loss"]["w_min"] == 0.25
    paper = {**paper, "models": {**paper["models"], "qwen3_4b": {**paper["models"]["qwen3_4b"],
                                                                  "train": {**paper["models"]["qwen3_4b"]["train"], "lora_targets": ["qkv"]}}}}
    assert settings.training_run(paper, W(model="qwen3_4b", method="opsd"))["lora_targets"] == ["qkv"]
    assert settings.checkpoint_root(paper, W(model="m", method="x")) == "results/training/m/x/checkpoints"
    assert settings.training_threads(paper) == 2 and settings.tiny_threads(paper) == 2
    tiny = load_config(REPO / "tiny" / "config" / "config.yaml")
    assert settings.training_threads(tiny) == 1 and settings.tiny_threads(tiny) == 2


def test_runs_are_configured_and_tables_select_among_them(paper):
    runs = [run for run in training_runs(paper) if run[0] in PAPER_MODELS]
    # train_all: every method on every trained model; the fitted schedule only where a diagnostic runs
    assert len(runs) == 3 * len(paper["methods"]) - 2 and ("olmo3_7b_think", "reopold") in runs
    assert ("qwen3_4b", "pwopsd_fitted") in runs and ("olmo3_7b_think", "pwopsd_fitted") not in runs
    shown = [run for run in runs_in_tables(paper) if run[0] in PAPER_MODELS]
    assert len(shown) == 16 and set(shown) <= set(runs)  # Tables 2-5 (14 runs) and the baselines table's ToDi and GKD
    assert settings.curve_runs(paper, W(model="dsr1_llama_8b")) == ["opsd", "pwopsd_moderate"]


def test_a_comparison_hands_the_tables_configured_labels_only(paper):
    """An unlabelled method reaches the significance and sweep tables without a label, so that they
    print its name LaTeX-escaped (pwopsd.report.tables.shown_name), not as a label taken verbatim."""
    import copy

    cfg = copy.deepcopy(paper)
    del cfg["methods"]["opsd"]["label"]
    labels = settings.significance_spec(cfg, W(table="main_4b"))["method_labels"]
    assert "opsd" not in labels and labels["pwopsd_moderate"] == paper["methods"]["pwopsd_moderate"]["label"]


def test_figure_and_table_params(paper):
    sched = settings.schedules(paper)
    assert list(sched) == ["pwopsd_mild", "pwopsd_moderate", "pwopsd_sharp", "pwopsd_aggressive", "pwopsd_fitted"]
    assert sched["pwopsd_moderate"] == {"label": "PW-OPSD Moderate", "params": [0.25, 0.30, 0.10]}
    assert sched["pwopsd_fitted"]["params"] is None  # read from the fit's file by the figure rule
    spec = settings.table_spec(paper, W(table="main_4b"))
    assert spec["kind"] == "main" and spec["n"] == 12
    diag = settings.diagnostic(paper, W(model="qwen3_4b"), "mc_dropout", "layers", "figure")
    assert diag["layers"] == "model.layers" and diag["figure"]["schedule_label"] == "PW-OPSD Moderate"
    assert settings.report_settings(paper) == {"diagnostic_model": "qwen3_4b", "tiny": False, "verdicts": "reference",
                                               "graders": ["corrected", "reference"]}


def test_the_number_of_training_processes_is_a_param_of_the_train_rule(paper, tmp_path):
    """Each training process takes its share of a step's problems, so gpus.train is part of what a
    run is: a param (which Snakemake compares when it decides what to rerun), not only the job's GPU
    resource (which it does not)."""
    import subprocess
    import sys

    assert settings.training_processes(paper, W(model="qwen3_4b")) == 4
    tiny = load_config(REPO / "tiny" / "config" / "config.yaml")
    assert settings.training_processes(tiny, W(model="tiny_qwen3")) == 1  # gpus.train 0: one CPU process
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text((REPO / "config" / "config.yaml").read_text())
    # the train job as Snakemake builds it, in a process of its own: including the Snakefile pins
    # this process's kernel path and exports PYTHONPATH, which later tests must not inherit
    job = subprocess.run([sys.executable, "-c", "from pwopsd.standalone import mock_snakemake; "
                          f"job = mock_snakemake('train', {str(tmp_path)!r}, model='qwen3_4b', method='opsd'); "
                          "print(job.params.processes, job.resources.gpu)"], capture_output=True, text=True, cwd=REPO)
    assert job.returncode == 0, job.stderr[-2000:]
    assert job.stdout.split()[-2:] == ["4", "4"]


def test_execution_settings_are_not_params(paper):
    ex = settings.execution_settings(paper, "qwen3_4b")
    assert set(ex) == {"hub", "backend_options"} and "tensor_parallel_size" in ex["backend_options"]


def test_rules_read_the_config_only_through_config_param():
    """One idiom: no rule file indexes `config` or derives a param in a lambda; every params,
    threads and resources value that depends on the config goes through `config_param`."""
    for smk in (REPO / "workflow" / "rules").glob("*.smk"):
        if smk.name == "common.smk":
            continue
        text = smk.read_text()
        assert not re.search(r"\bconfig\[|config\.get\(|cfgmod\.|lambda", text), smk.name
    rules = "".join(p.read_text() for p in (REPO / "workflow" / "rules").glob("*.smk") if p.name != "common.smk")
    for name in re.findall(r"config_param\(settings\.(\w+)", rules):
        assert callable(getattr(settings, name)), name


@pytest.mark.slow
def test_train_all_plans_every_configured_run(paper):
    out = run_snakemake(["-n", "train_all", "--quiet", "rules"]).stdout
    counts = job_counts(out)
    # every planned run (the paper's: 3 models x 11 methods (9 of the paper, ToDi and GKD) + the fitted schedule on
    # the diagnosed Qwen3-4B, after its diagnostic and fit_schedule: 34, test above); nothing evaluated
    assert counts["train"] == len(training_runs(paper)) and counts["fit_schedule"] == 1 and "generate" not in counts


@pytest.mark.slow
def test_the_paper_dry_run_has_the_diagnostic_to_fitted_schedule_chain():
    """results/tables/schedules_4b.tex in the paper configuration: Qwen3-4B's diagnostic phases ->
    fit_schedule -> train of pwopsd_fitted (and of the four hand-picked schedules) -> evaluation."""
    out = run_snakemake(["-n", "results/tables/schedules_4b.tex", "--quiet", "rules"]).stdout
    counts = job_counts(out)
    assert counts["train"] == 5 and counts["fit_schedule"] == 1 and counts["branch_scores"] == 1
    assert counts["spines"] == 1 and counts["forced_continuation"] == 1 and counts["merge_adapter"] == 5


def test_generation_seeds_per_job(paper):
    assert settings.generation_seeds(paper, W(seed="2")) == {"2": 2}
    # seeds_per_job: all (no seed wildcard): every seed of the checkpoint; a swept step's: evaluation.sweep_seeds
    assert settings.generation_seeds(paper, W(checkpoint="opsd")) == {"main": None, "1": 1, "2": 2}
    swept = {**paper, "evaluation": {**paper["evaluation"], "sweep_seeds": [1]}}
    assert settings.generation_seeds(swept, W(checkpoint="opsd-step50")) == {"1": 1}
    assert settings.generation_seeds(swept, W(checkpoint="opsd")) == {"main": None, "1": 1, "2": 2}
    assert settings.seeds_per_job(paper) == "one"


def test_the_fitted_schedules_chain_goes_first(paper):
    """Chain heads first (train before merge before generate before grade), and the diagnostic ->
    fit -> train -> evaluation chain, the DAG's longest path, before any other run (priorities order
    ready jobs only)."""
    fitted = settings.chain_priority(paper, W(model="qwen3_4b", method="pwopsd_fitted"), 3)
    assert fitted == settings.DIAGNOSTIC_PRIORITY + 3
    assert settings.chain_priority(paper, W(model="qwen3_4b", checkpoint="pwopsd_fitted", seed="1"), 0) == settings.DIAGNOSTIC_PRIORITY
    assert settings.chain_priority(paper, W(model="qwen3_4b", method="opsd"), 3) == 3
    assert settings.chain_priority(paper, W(model="qwen3_4b", checkpoint="base", seed="1"), 0) == 0
