"""The workflow itself: paper-config dry runs list the expected jobs without the network, and the
tiny configuration runs end to end (model build with its teacher-gap check, data, generations),
with a rerun doing no work."""

import json
from pathlib import Path
import re
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import yaml

import background
from conftest import REPO, copy_tiny_inputs, job_counts, run_snakemake, session_tmp, tiny_workdir
from pwopsd.cost import parse_dry_run
from pwopsd.io import read_parquet_metadata


def test_paper_dry_run_lists_data_and_generation_jobs():
    proc = run_snakemake(["-n", "--quiet", "rules"])
    counts = job_counts(proc.stdout + proc.stderr)
    # Qwen3-4B: 5 methods + 3 more schedules + the fitted schedule + 2 ablation cells + ToDi and GKD (the baselines
    # table, beyond the paper); DSR1 and Olmo: OPSD, PW-OPSD
    runs = 12 + 2 + 2
    seeds = 3
    assert counts["prepare_benchmark"] == 4 and counts["fetch_model"] == 3 and counts["prepare_train_corpus"] == 1
    # one generation and one grading job per (model, checkpoint, seed), each covering the 4 benchmarks
    assert counts["generate"] == (3 + runs) * seeds and counts["grade"] == (3 + runs) * seeds
    assert counts["train"] == runs and counts["merge_adapter"] == runs
    assert counts["table"] == 5 and counts["schedules_figure"] == 1 and counts["aggregate_metrics"] == 1
    assert all(counts[phase] == 1 for phase in DIAGNOSTIC_PHASES + ["branch_auroc_table", "branch_auroc_figure", "fit_schedule"])
    assert "build_tiny_model" not in counts


DIAGNOSTIC_PHASES = ["spines", "teacher_pass", "candidates", "mc_dropout", "forced_continuation", "viability_labels",
                     "branch_scores"]


def test_branch_auroc_dry_run_lists_exactly_the_phase_jobs():
    proc = run_snakemake(["-n", "results/figures/branch_auroc.pdf", "results/tables/branch_auroc.tex"])
    out = proc.stdout + proc.stderr
    counts = job_counts(out)
    assert counts == {"fetch_model": 1, "prepare_benchmark": 3, **{p: 1 for p in DIAGNOSTIC_PHASES},
                      "branch_auroc_table": 1, "branch_auroc_figure": 1, "fit_schedule": 1, "total": 14}  # Figure 1B overlays the fit
    assert set(re.findall(r"results/data/benchmarks/(\w+)\.parquet", out)) == {"math500", "aime2024", "aime2025"}
    assert "results/diagnostic/qwen3_4b/spines.parquet" in out and "results/models/qwen3_4b/base.json" in out
    # GPUs from the model entry: generation phases get gpus.generate, HF forwards gpus.forward, the rest none.
    resources = {job.rule: job.resources for job in parse_dry_run(out)}
    for rule, gpus in {"spines": 4, "forced_continuation": 4, "teacher_pass": 1, "mc_dropout": 1}.items():
        assert resources[rule].get("gpu") == str(gpus), rule
    for rule in ("candidates", "viability_labels", "branch_scores", "branch_auroc_table", "fit_schedule"):
        assert "gpu" not in resources[rule], rule


def test_main_table_dry_run_lists_exactly_the_papers_runs():
    proc = run_snakemake(["-n", "results/tables/main_4b.tex"])
    out = proc.stdout + proc.stderr
    counts = job_counts(out)
    assert counts == {"fetch_model": 1, "prepare_benchmark": 4, "prepare_train_corpus": 1, "train": 5, "merge_adapter": 5,
                      "generate": 15, "grade": 15, "table": 1, "total": 47}
    trained = set(re.findall(r"wildcards: model=(\w+), method=(\w+)", out))
    assert trained == {("qwen3_4b", m) for m in ("opsd", "eopd", "reopold", "pwopsd_moderate", "pwopsd_aggressive")}


def test_three_training_seeds_give_three_chains_per_table_2_method():
    """config/seeds.yaml: every method of Table 2 trained with seeds 42, 1 and 2, each run its own
    chain (train, merge, 3 eval seeds), the first under the method's own name."""
    proc = run_snakemake(["-n", "results/tables/main_4b.tex", "results/tables/significance_main_4b.tex",
                          "--configfile", "config/seeds.yaml"])
    out = proc.stdout + proc.stderr
    counts = job_counts(out)
    assert counts["train"] == 15 and counts["merge_adapter"] == 15 and counts["generate"] == 45 and counts["grade"] == 45
    assert counts["table"] == 1 and counts["significance"] == 1
    trained = set(re.findall(r"wildcards: model=(\w+), method=([\w-]+)", out))
    methods = ("opsd", "eopd", "reopold", "pwopsd_moderate", "pwopsd_aggressive")
    assert trained == {("qwen3_4b", run) for m in methods for run in (m, f"{m}-seed1", f"{m}-seed2")}


@pytest.mark.long
def test_a_checkpoint_sweep_of_table_2_adds_evaluations_and_no_training(capsys):
    """config/sweep.yaml (evaluation.sweep_steps: every saved step besides 100): each of Table 2's
    runs is also merged, generated (3 eval seeds) and graded at 5 more steps, from the adapters its
    training saved, and the base model (the figure's reference line; evaluated anyway in a full
    run); not one training job more. The cost plan prices the sweep."""
    from pwopsd import cost

    plain = job_counts(run_snakemake(["-n", "results/tables/main_4b.tex"]).stdout)
    proc = run_snakemake(["-n", "results/tables/main_4b.tex", "results/tables/sweep_main_4b.tex", "--configfile", "config/sweep.yaml"])
    out = proc.stdout + proc.stderr
    swept = job_counts(out)
    assert swept["train"] == plain["train"] == 5 and swept["merge_adapter"] == plain["merge_adapter"]
    assert swept["step_adapter"] == swept["merge_step_adapter"] == 5 * 5 and swept["sweep"] == 1
    assert swept["generate"] == plain["generate"] + 5 * 5 * 3 + 3 and swept["grade"] == plain["grade"] + 5 * 5 * 3 + 3
    cheaper = job_counts(run_snakemake(["-n", "results/tables/sweep_main_4b.tex", "--configfile", "config/sweep.yaml",
                                        "--config", "evaluation={sweep_seeds: [1]}"]).stdout)
    assert cheaper["generate"] == plain["generate"] + 5 * 5 + 3 and cheaper["train"] == 5  # one eval seed a swept step
    steps = set(re.findall(r"wildcards: model=qwen3_4b, method=(\w+), step=(\d+)", out))
    assert steps == {(m, s) for m in ("opsd", "eopd", "reopold", "pwopsd_moderate", "pwopsd_aggressive")
                     for s in ("25", "50", "75", "125", "150")}
    def priced():
        text = capsys.readouterr().out
        generate = re.search(r"^generate\s+(\d+)\s+\d+\s+[\d.]+\s+([\d.]+)", text, re.M)
        return float(re.search(r"^total\s+\d+\s+([\d.]+)$", text, re.M).group(1)), int(generate.group(1)), float(generate.group(2))

    cost.main(["--all", "results/tables/main_4b.tex"])
    table_total, table_jobs, table_generate = priced()
    cost.main(["--all", "--configfile", "config/sweep.yaml", "results/tables/main_4b.tex", "results/tables/sweep_main_4b.tex"])
    sweep_total, sweep_jobs, sweep_generate = priced()
    assert sweep_jobs == table_jobs + 78 and sweep_generate / sweep_jobs == pytest.approx(table_generate / table_jobs, rel=0.01)
    assert sweep_total - table_total == pytest.approx(sweep_generate - table_generate, abs=0.2)  # the generations, nothing else


@pytest.mark.long
def test_the_smoke_canary_plans_every_rule_of_the_paper_dag_at_the_smallest_sizes(capsys):
    """config/smoke.yaml (README, "Before the full run"): the same rules as the full paper DAG, with
    3-step trainings evaluated at step 2, two samples and two seeds a checkpoint (sampled in one job),
    a few problems a benchmark; the cost plan prices it at a small fraction of the full run."""
    from pwopsd import cost

    full = job_counts(run_snakemake(["-n", "--quiet", "rules"]).stdout)
    proc = run_snakemake(["-n", "--configfile", "config/smoke.yaml"])
    out = proc.stdout + proc.stderr
    smoke = job_counts(out)
    assert set(smoke) == set(full), set(full) ^ set(smoke)
    # every training run; one generate and one grade job a checkpoint (both seeds), the full run's one a seed of 3
    assert smoke["train"] == full["train"] and smoke["generate"] == smoke["grade"] == full["generate"] // 3
    from pwopsd.config import load_config_files, training_config

    cfg = load_config_files([REPO / "config" / "config.yaml", REPO / "config" / "smoke.yaml"])
    assert cfg["training"]["eval_step"] == 2 and training_config(cfg, "dsr1_llama_8b", "opsd")["max_steps"] == 3
    assert cfg["evaluation"]["n"] == 2 and cfg["benchmarks"]["math500"]["first_rows"] == 4
    cost.main(["--all", "--configfile", "config/smoke.yaml"])
    smoke_gpu_h = float(re.search(r"^total\s+\d+\s+([\d.]+)$", capsys.readouterr().out, re.M).group(1))
    cost.main(["--all"])
    full_gpu_h = float(re.search(r"^total\s+\d+\s+([\d.]+)$", capsys.readouterr().out, re.M).group(1))
    assert 0 < smoke_gpu_h < 0.04 * full_gpu_h, (smoke_gpu_h, full_gpu_h)


def test_first_rows_keeps_the_checked_sources_first_problems(tmp_path):
    from pwopsd.data import DataError, prepare_dataset

    entry = {"source": {"kind": "tiny", "n": 10, "levels": [1], "seed": 3}, "columns": {}, "expected_rows": 10}
    whole, _ = prepare_dataset(entry, "benchmarks.t")
    first, manifest = prepare_dataset({**entry, "first_rows": 4}, "benchmarks.t")
    assert first.equals(whole.head(4)) and manifest["rows"] == 4 and manifest["first_rows"] == 4
    with pytest.raises(DataError, match="expected_rows: expected 11 rows"):  # the whole source is still checked
        prepare_dataset({**entry, "expected_rows": 11, "first_rows": 4}, "benchmarks.t")


def test_paper_generation_jobs_request_the_model_gpus():
    proc = run_snakemake(["-n", "results/generations/dsr1_llama_8b/base/aime2025/seed-main.parquet"])
    out = proc.stdout + proc.stderr
    assert re.search(r"rule generate:.*?resources: [^\n]*gpu=4", out, re.S)
    assert "aime2025/seed-main.parquet" in out and "math500/seed-main.parquet" in out  # one job, all benchmarks
    assert re.search(r"rule prepare_benchmark:(?:(?!rule ).)*?resources: (?:(?!gpu).)*$", out, re.S | re.M)


def _assert_ready_with_margin(report: dict, cfg: dict) -> None:
    """The build check's targets, with the configured margin to spare, on the whole dev set (the
    facts' greedy target without one)."""
    acc, margin = report["dev_accuracy"], cfg["check_margin"]
    lo, hi = cfg["student_accuracy_range"]
    assert acc["teacher"]["mean"] - acc["student"]["mean"] >= cfg["min_teacher_gap"] + margin - 1e-9, acc
    for fmt in ("student", "eval"):
        assert lo + margin - 1e-9 <= acc[fmt]["mean"] <= hi - margin + 1e-9, (fmt, acc)
    assert acc["student_greedy"]["mean"] >= cfg["min_greedy_accuracy"] - 1e-9, acc  # the student knows its facts
    assert report["dev_checks"][-1]["passed"] and report["dev_checks"][-1]["step"] == report["pretraining_steps"]
    assert not any(c["passed"] for c in report["dev_checks"][:-1])  # it stopped at the first check that passed


@pytest.mark.workflow
def test_tiny_run_builds_a_model_with_a_teacher_gap(tiny_run):
    workdir, _ = tiny_run
    report = json.loads((workdir / "results/models/tiny_qwen3/build_report.json").read_text())
    cfg = yaml.safe_load((workdir / "config/config.yaml").read_text())["tiny"]
    _assert_ready_with_margin(report, cfg)
    assert report["pretraining_steps"] < cfg["max_steps"] and report["cpu_capability"]
    assert (workdir / "results/models/tiny_qwen3/base/model.safetensors").exists()


def _tiny_config_copy(name: str) -> Path:
    """A fresh working directory of the session holding tiny mode's config."""
    work = session_tmp(name)
    shutil.copytree(REPO / "tiny" / "config", work / "config")
    return work


def _metric_summaries(workdir: Path, checkpoints) -> list[dict]:
    return [json.loads(f.read_text()) for c in checkpoints
            for f in sorted((workdir / "results/metrics/tiny_qwen3" / c).glob("*/seed-*.json"))]


def _learning_gains(summaries: list[dict], runs: list[str]) -> dict:
    from pwopsd.report.significance import gains_over_base

    benchmarks = sorted({s["benchmark"] for s in summaries})
    gains = gains_over_base(summaries, "tiny_qwen3", runs, benchmarks)
    print("Avg@12 over the base model, mean of the benchmarks, 95% interval: "
          + "; ".join(f"{r} {c.delta:+.2f} [{c.low:+.2f}, {c.high:+.2f}]" for r, c in gains.items()))
    return gains


@pytest.mark.workflow
def test_self_distillation_beats_the_base_model(tiny_run):
    """Tiny mode is a toy in which the method works: every training run of OPSD and PW-OPSD
    Moderate (two training seeds each) beats the base model it started from, with a paired 95%
    interval over problems that excludes 0 (Avg@12, mean of the four benchmarks). The same check
    fails for a broken training (the next test)."""
    from pwopsd.config import load_config
    from pwopsd.config.design import method_runs
    from pwopsd.report.significance import learning_problems

    workdir, _ = tiny_run
    cfg = load_config(workdir / "config/config.yaml")
    runs = method_runs(cfg, "opsd") + method_runs(cfg, "pwopsd_moderate")
    assert len(runs) == 4
    gains = _learning_gains(_metric_summaries(workdir, ["base", *runs]), runs)
    assert not learning_problems(gains)


BROKEN_METHODS = {"opsd_no_solution": {"loss": "opsd", "teacher_prompt": "no_solution", "label": "OPSD, no solution"},
                  "opsd_teacher_student": {"loss": "opsd", "teacher_prompt": "student", "label": "OPSD, teacher = student"}}


@background.part("broken trainings", after=("tiny model",))
def _broken_trainings():
    """OPSD trained twice more from the tiny run's model, broken on purpose: the teacher prompt
    without the privileged solution, and the student's own prompt (teacher = student); each merged,
    evaluated and graded like the tiny run's checkpoints."""

    def run():
        work = _tiny_config_copy("tiny_broken")
        copy_tiny_inputs(tiny_workdir(), work)
        (work / "config" / "broken.yaml").write_text(yaml.safe_dump({"methods": BROKEN_METHODS}))
        targets = [f"results/metrics/tiny_qwen3/{m}/{b}/seed-{s}.json" for m in BROKEN_METHODS
                   for b in ("arith_l1", "arith_l2", "arith_l3", "arith_l4") for s in ("main", "1", "2")]
        proc = run_snakemake(["--cores", "1", "--directory", str(work), *targets, "--configfile", str(work / "config" / "broken.yaml")],
                             check=False)
        return work, proc

    return run


@pytest.fixture(scope="module")
def broken_trainings():
    return background.result("broken trainings")


@pytest.mark.workflow
def test_a_broken_training_does_not_beat_the_base_model(tiny_run, broken_trainings):
    """The learning check above, run on two broken trainings: it must fail for both (no interval
    above 0). Teacher = student has nothing to teach (its first step's divergence is 0 to rounding;
    Adam still turns rounding into small steps); the teacher without the privileged solution knows
    nothing the student does not."""
    from pwopsd.report.significance import learning_problems

    workdir, _ = tiny_run
    work, proc = broken_trainings
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    summaries = _metric_summaries(workdir, ["base"]) + _metric_summaries(work, list(BROKEN_METHODS))
    gains = _learning_gains(summaries, list(BROKEN_METHODS))
    problems = learning_problems(gains)
    assert [line.split(":")[0] for line in problems] == list(BROKEN_METHODS), problems
    first = json.loads((work / "results/training/tiny_qwen3/opsd_teacher_student/train_log.jsonl").read_text().splitlines()[0])
    assert abs(first["kl"]) < 1e-6  # it was teacher = student


@pytest.mark.workflow
def test_tiny_results_equal_the_committed_digest(tiny_run):
    """Every number of the tiny run (each table's values, the data behind each figure, the build)
    equals tiny/digest.json, bit for bit: tiny mode pins its CPU kernel path, so every host gives
    these digits. A change that moves a number updates the digest in the same commit."""
    from pwopsd.report.digest import collect, compare, platform_lines, read_digest

    workdir, _ = tiny_run
    committed = read_digest(REPO / "tiny" / "digest.json")
    moved = compare(committed, collect(workdir / "results"))
    assert not moved, ("the tiny run's numbers differ from tiny/digest.json; if the change is meant, update it with\n"
                       "  .venv/bin/snakemake --directory tiny && .venv/bin/python -m pwopsd.report.digest tiny/results "
                       "--update tiny/digest.json\n" + "\n".join(moved) + "\n" + "\n".join(platform_lines(committed)))


@pytest.mark.workflow
def test_tiny_run_generations_for_every_benchmark_and_seed(tiny_run):
    workdir, _ = tiny_run
    for bench, rows in {"arith_l1": 24, "arith_l2": 12, "arith_l3": 12, "arith_l4": 12}.items():
        for seed in ("main", "1", "2"):
            path = workdir / f"results/generations/tiny_qwen3/base/{bench}/seed-{seed}.parquet"
            df = pd.read_parquet(path)
            assert len(df) == rows * 12
            assert set(df.columns) >= {"problem_id", "sample_index", "text", "num_tokens", "finish_reason"}
            assert df.groupby("problem_id")["sample_index"].apply(sorted).map(lambda s: s == list(range(12))).all()
            meta = read_parquet_metadata(path)
            assert meta["sampling"]["n"] == 12 and meta["sampling"]["top_p"] == 0.95
            assert meta["sampling"]["seed"] == (None if seed == "main" else int(seed))
            assert meta["versions"]["torch"] and meta["backend"]["backend"] == "hf"
    a = pd.read_parquet(workdir / "results/generations/tiny_qwen3/base/arith_l2/seed-1.parquet")
    b = pd.read_parquet(workdir / "results/generations/tiny_qwen3/base/arith_l2/seed-2.parquet")
    assert (a["text"] != b["text"]).any()  # seeds differ
    assert (a["text"].str.contains("\\boxed{", regex=False)).mean() > 0.8  # the model formats its answers


@pytest.mark.workflow
def test_tiny_run_grades_and_aggregates_over_seeds(tiny_run):
    workdir, _ = tiny_run
    metrics = json.loads((workdir / "results/metrics/tiny_qwen3/base/arith_l2/seed-1.json").read_text())
    assert metrics["num_problems"] == 12 and metrics["num_samples"] == 144
    assert set(metrics["metrics_pct"]) == {"avg", "pass", "maj", "maj_string", "format_rate"}
    assert metrics["versions"]["math-verify"] == "0.8.0"
    graded = pd.read_parquet(workdir / "results/graded/tiny_qwen3/base/arith_l2/seed-1.parquet")
    bench = pd.read_parquet(workdir / "results/data/benchmarks/arith_l2.parquet").set_index("id")["answer"]
    # For integer answers, math-equivalence is exact string equality of the extracted answer.
    exact = graded["extracted"] == graded["problem_id"].map(bench)
    assert (graded["correct"] == exact).all()
    assert metrics["metrics_pct"]["avg"] == pytest.approx(100 * exact.mean())
    summary = pd.read_csv(workdir / "results/metrics/summary.csv")
    assert set(summary["benchmark"]) == {"arith_l1", "arith_l2", "arith_l3", "arith_l4", "mean"}
    assert set(summary["checkpoint"]) == {"base", *TINY_METHODS}
    row = summary[(summary.checkpoint == "base") & (summary.benchmark == "mean") & (summary.metric == "avg")].iloc[0]
    per_seed = pd.read_csv(workdir / "results/metrics/per_seed.csv")
    base = per_seed[(per_seed.checkpoint == "base") & (per_seed.metric == "avg")]
    avg = base.pivot(index="seed", columns="benchmark", values="value")
    assert row["n_seeds"] == 3
    assert row["mean"] == pytest.approx(avg.mean(axis=1).mean(), abs=1e-5)  # the CSV holds 6 decimals
    assert row["std"] == pytest.approx(avg.mean(axis=1).std(ddof=1), abs=1e-5)


TINY_METHODS = ["opsd", "eopd", "reopold", "pwopsd_mild", "pwopsd_moderate", "pwopsd_sharp", "pwopsd_aggressive",
                "uniform_perseq", "posw_global", "pwopsd_fitted", "todi", "gkd"]


@pytest.mark.workflow
def test_tiny_run_trains_every_method_and_merges(tiny_run):
    workdir, _ = tiny_run
    for method in TINY_METHODS:
        log = [json.loads(x) for x in (workdir / f"results/training/tiny_qwen3/{method}/train_log.jsonl").read_text().splitlines()]
        # training.stop_at: the tiny runs stop at their evaluation step, 16 of a 24-step schedule
        assert [x["step"] for x in log] == list(range(1, 17)), method
        assert [x["lr"] for x in log] == pytest.approx([1e-3 * (1 - s / 24) for s in range(1, 17)])
        assert all(np.isfinite(x["loss"]) for x in log)
        assert (workdir / f"results/training/tiny_qwen3/{method}/adapter/adapter_model.safetensors").exists()
        manifest = json.loads((workdir / f"results/models/tiny_qwen3/{method}/manifest.json").read_text())
        assert manifest["step"] == 16 and (workdir / manifest["path"] / "model.safetensors").exists()
        assert (workdir / f"results/metrics/tiny_qwen3/{method}/arith_l1/seed-2.json").exists()


@pytest.mark.workflow
def test_tiny_run_writes_tables_and_figures(tiny_run):
    workdir, _ = tiny_run
    main = (workdir / "results/tables/main_4b.tex").read_text()
    assert main.count("\\multirow{4}{*}") == 5 and "Pass@12 & Avg@12 & Maj@12" in main and "& --" not in main
    assert main.count("\\mathbf") >= 12  # at least one bold cell per benchmark-metric column
    sched = (workdir / "results/tables/schedules_4b.tex").read_text()
    assert sched.count("\\multirow{4}{*}") == 5 and sched.count("\\cmidrule") == 4 and "\\multirow{4}{*}{Fitted}" in sched
    cross = (workdir / "results/tables/cross_model.tex").read_text()
    assert "Tiny-Qwen3" in cross and "Arith-4 & Avg@12" in cross
    ablation = (workdir / "results/tables/ablation_4b.tex").read_text()
    assert "Pos-w / global" in ablation
    # bold = the column maximum, ties included (the toy's Avg@12 takes few values, a mean of 12
    # problems' 12 samples: two cells tie on some kernel paths, e.g. AVX512 on the Zen 5 host)
    cells = {line.split(" & ")[0]: line for line in ablation.splitlines() if " & $" in line}
    values = {name: float(re.search(r"([0-9.]+) \\pm", line).group(1)) for name, line in cells.items()}
    assert len(cells) == 4 and {n for n, line in cells.items() if "\\mathbf" in line} == \
        {n for n, v in values.items() if v == max(values.values())}
    numbers = pd.read_csv(workdir / "results/tables/main_4b.csv")
    assert set(numbers["checkpoint"]) == {"opsd", "eopd", "reopold", "pwopsd_moderate", "pwopsd_aggressive"}
    baselines = pd.read_csv(workdir / "results/tables/baselines_4b.csv")  # beyond the paper: ToDi and GKD
    assert set(baselines["checkpoint"]) == {"opsd", "todi", "gkd", "pwopsd_moderate"}
    tex = (workdir / "results/tables/baselines_4b.tex").read_text()
    assert tex.count("\\multirow{4}{*}") == 4 and "ToDi" in tex and "GKD (JSD 0.9)" in tex and "& --" not in tex
    for fig in ("pwopsd_schedules", "training_curves_tiny_qwen3", "deltas_main_4b", "deltas_schedules_4b", "deltas_cross_model",
                "deltas_baselines_4b"):
        assert (workdir / f"results/figures/{fig}.pdf").read_bytes()[:5] == b"%PDF-"
        assert len(pd.read_csv(workdir / f"results/figures/{fig}.csv")) > 0


@pytest.mark.workflow
def test_tiny_run_tests_each_method_against_opsd(tiny_run):
    """Beyond the paper: significance tables for the main, schedules and cross-model tables, each
    method against OPSD on every benchmark and the mean column, from the same metrics as the tables."""
    workdir, _ = tiny_run
    sig = pd.read_csv(workdir / "results/tables/significance_main_4b.csv")
    assert set(sig["method"]) == {"eopd", "reopold", "pwopsd_moderate", "pwopsd_aggressive"} and set(sig["baseline"]) == {"opsd"}
    assert set(sig["benchmark"]) == {"arith_l1", "arith_l2", "arith_l3", "arith_l4", "mean"}
    assert set(sig["metric"]) == {"avg", "maj", "pass"} and len(sig) == 4 * 5 * 3
    assert (sig["low"] <= sig["delta"] + 1e-9).all() and (sig["delta"] <= sig["high"] + 1e-9).all()
    assert ((sig["p"] >= 0) & (sig["p"] <= sig["p_holm"]) & (sig["p_holm"] <= 1)).all()
    # one model gives both: the interval excludes 0 exactly when p < 0.05 (before Holm)
    assert (((sig["low"] > 0) | (sig["high"] < 0)) == (sig["p"] < 0.05)).all()
    assert (sig["eval_seeds"] == 3).all() and (sig["baseline_runs"] == 2).all()  # OPSD: training seeds 42 and 43
    assert sig["run_variance_included"].all()  # OPSD's two runs estimate the training-run variance
    assert set(sig.loc[sig["method_runs"] == 2, "method"]) == {"pwopsd_moderate"} and (sig["method_runs"] <= 2).all()
    table = pd.read_csv(workdir / "results/tables/main_4b.csv")
    table = table[table["metric"] == "avg"]
    assert (table.loc[table["checkpoint"].isin(["opsd", "pwopsd_moderate"]), "n_seeds"] == 6).all()  # 2 runs x 3 seeds
    cell = lambda c, b: table[(table["checkpoint"] == c) & (table["benchmark"] == b)]["mean"].item()  # noqa: E731
    row = sig[(sig["method"] == "pwopsd_moderate") & (sig["benchmark"] == "arith_l3") & (sig["metric"] == "avg")].iloc[0]
    assert row["delta"] == pytest.approx(cell("pwopsd_moderate", "arith_l3") - cell("opsd", "arith_l3"), abs=1e-4)
    sched = pd.read_csv(workdir / "results/tables/significance_schedules_4b.csv")
    assert "pwopsd_fitted" in set(sched["method"]) and set(sched["baseline"]) == {"opsd"}
    tex = (workdir / "results/tables/significance_main_4b.tex").read_text()
    assert tex.count("Avg@12 & Tiny-Qwen3 &") == 4 and "Holm" in tex


@pytest.mark.workflow
def test_tiny_run_branch_viability_diagnostic(tiny_run):
    from pwopsd.diagnostic import statistics as stats

    workdir, _ = tiny_run
    d = workdir / "results/diagnostic/tiny_qwen3"
    spines = pd.read_parquet(d / "spines.parquet")
    assert len(spines) == 36 and spines.groupby("dataset").size().to_dict() == {"arith_l1": 12, "arith_l2": 12, "arith_l3": 12}
    labels = pd.read_parquet(d / "labels.parquet")
    cont = pd.read_parquet(d / "forced_continuations.parquet")
    assert (labels["n_continuations"] == 18).all() and len(cont) == 18 * len(labels)
    summary = json.loads((d / "branch_auroc.json").read_text())
    scored = pd.read_parquet(d / "scored.parquet")
    pool = scored[scored["spine_correct"] & scored["label"].isin([stats.REAL_UNCERTAIN, stats.DIVERSITY])]
    c = summary["counts"]
    assert c["real_uncertain"] == (pool["label"] == stats.REAL_UNCERTAIN).sum() and c["diversity"] == (pool["label"] == stats.DIVERSITY).sum()
    assert c["correct_spines"] == spines["correct"].sum() and c["candidates"] == len(labels)
    table = (workdir / "results/tables/branch_auroc.tex").read_text()
    assert f"separating ${c['real_uncertain']}$ \\emph{{real-uncertain}}" in table
    if summary["status"] == "ok":
        y = (pool["label"] == stats.REAL_UNCERTAIN).astype(int)
        groups = pool["dataset"] + "/" + pool["problem_id"]
        row = next(r for r in summary["scores"] if r["score"] == "early_position")
        raw = stats.residualized_auroc(pool["early_position"], y, groups)
        assert row["auroc_raw"] == pytest.approx(raw) and row["auroc_folded"] == pytest.approx(max(raw, 1 - raw))
        assert row["auroc"] == row[f"auroc_{summary['orientation']}"]  # the table's orientation (config)
        assert f"{row['auroc']:.2f}" in table and "n/a" not in table
    else:
        assert "Not computable" in table
    for fig in ("branch_auroc", "branch_auroc_scatter"):
        assert (workdir / f"results/figures/{fig}.pdf").read_bytes()[:5] == b"%PDF-"
    panels = pd.read_csv(workdir / "results/figures/branch_auroc.csv")
    assert set(panels["panel"]) == {"A", "B"} and panels["series"].str.startswith("schedule").any()


@pytest.mark.workflow
def test_tiny_run_fits_a_schedule_and_trains_with_it(tiny_run):
    """Beyond the paper: the schedule fitted to the tiny diagnostic is what pwopsd_fitted trained
    with, and both figures draw it with its bootstrap band."""
    from pwopsd.schedule import schedule_weight

    workdir, _ = tiny_run
    fit = json.loads((workdir / "results/diagnostic/tiny_qwen3/fitted_schedule.json").read_text())
    p = fit["params"]
    assert 0 < p["w_min"] <= 1 and p["s"] > 0 and fit["n_boot_used"] > 0.9 * fit["n_boot"]
    for k in ("w_min", "tau", "s"):
        lo, hi = fit["ci"][k]
        assert lo <= p[k] <= hi or abs(p[k] - np.clip(p[k], lo, hi)) < 1e-6, (k, p[k], lo, hi)
    assert fit["curve"]["w"] == pytest.approx(list(schedule_weight(np.asarray(fit["curve"]["r"]), **p)))
    runs = [json.loads(f.read_text()) for f in (workdir / "results/training/tiny_qwen3/pwopsd_fitted/checkpoints").glob("*/run.json")]
    assert len(runs) == 1 and {k: runs[0]["train"]["loss"][k] for k in p} == p  # trained with exactly the fitted schedule
    figure2 = pd.read_csv(workdir / "results/figures/pwopsd_schedules.csv")
    assert {"pwopsd_fitted", "pwopsd_fitted_low", "pwopsd_fitted_high"} <= set(figure2.columns)
    figure1 = pd.read_csv(workdir / "results/figures/branch_auroc.csv")
    assert {"fitted w(r)", "fitted w(r) band low", "fitted w(r) band high"} <= set(figure1["series"])


@pytest.mark.workflow
def test_new_diagnostic_labels_retrain_only_the_fitted_schedule(tiny_run, tmp_path):
    """The DAG edge diagnostic -> fit -> train: new labels (in a copy of the finished tiny run) rerun
    the scores, the fit, the fitted method's training, merge, evaluation and the tables/figures,
    and no other training run. (A touch alone reruns nothing: Snakemake 9 compares the content of
    an input whose mtime changed.)"""
    workdir, _ = tiny_run
    copy = tmp_path / "tiny"
    shutil.copytree(workdir, copy, symlinks=True)
    labels_path = copy / "results/diagnostic/tiny_qwen3/labels.parquet"
    assert "Nothing to be done" in run_snakemake(["-n", "--directory", str(copy)]).stdout
    labels = pd.read_parquet(labels_path)
    labels.loc[0, "mean_viability"] = 1.0 - labels.loc[0, "mean_viability"]
    labels.to_parquet(labels_path)
    proc = run_snakemake(["-n", "--directory", str(copy)])
    jobs = parse_dry_run(proc.stdout + "\n" + proc.stderr)
    by_rule = {}
    for job in jobs:
        by_rule.setdefault(job.rule, []).append(job.wildcards)
    assert {"branch_scores", "fit_schedule", "train", "merge_adapter", "generate", "grade"} <= set(by_rule), by_rule
    assert [w["method"] for w in by_rule["train"]] == ["pwopsd_fitted"] and len(by_rule["merge_adapter"]) == 1
    assert {w["checkpoint"] for w in by_rule["generate"] + by_rule["grade"]} == {"pwopsd_fitted"}
    assert not {"spines", "teacher_pass", "candidates", "mc_dropout", "forced_continuation", "viability_labels",
                "build_tiny_model"} & set(by_rule)


@pytest.mark.workflow
def test_tiny_run_sweeps_table_2_at_a_saved_step_without_training_again(tiny_run):
    """Beyond the paper (tiny: evaluation.sweep_steps [8], one eval seed): Table 2's runs at step 8 and the
    evaluation step 16, from the checkpoints training saved; at step 16 the sweep's numbers are the
    significance table's and the main table's; a wider sweep plans no training job."""
    workdir, _ = tiny_run
    sweep = pd.read_csv(workdir / "results/tables/sweep_main_4b.csv")
    methods = {"opsd", "eopd", "reopold", "pwopsd_moderate", "pwopsd_aggressive"}
    assert set(sweep["method"]) == methods and set(sweep["step"]) == {8, 16}
    assert set(sweep.loc[sweep["eval_step"], "step"]) == {16}
    assert set(sweep.loc[sweep["step"] == 8, "eval_seeds"]) == {1} and set(sweep.loc[sweep["step"] == 16, "eval_seeds"]) == {3}
    sig = pd.read_csv(workdir / "results/tables/significance_main_4b.csv")
    at_eval = sweep[(sweep["step"] == 16) & sweep["delta"].notna()].merge(sig, on=["method", "metric", "benchmark"])
    assert len(at_eval) == len(sig) and np.allclose(at_eval["delta_x"], at_eval["delta_y"], atol=1e-4)
    table = pd.read_csv(workdir / "results/tables/main_4b.csv").rename(columns={"checkpoint": "method"})
    cells = sweep[sweep["step"] == 16].merge(table, on=["method", "metric", "benchmark"])
    assert len(cells) > 0 and np.allclose(cells["value"], cells["mean"], atol=0.01)
    mean = sweep[(sweep["metric"] == "avg") & (sweep["benchmark"] == "mean")]
    for step in (8, 16):  # ranks 1..5 by value, equal values sharing the lower rank
        part = mean[mean["step"] == step]
        assert all(r == 1 + (part["value"] > v).sum() for r, v in zip(part["rank"], part["value"]))
    assert mean["best_step"].isin([8, 16]).all() and mean["rank_holds"].isin([True, False]).all()
    assert "step 16$^{*}$" in (workdir / "results/tables/sweep_main_4b.tex").read_text()
    assert (workdir / "results/figures/sweep_main_4b.pdf").read_bytes()[:5] == b"%PDF-"
    assert "## Published differences across the checkpoint sweep" in (workdir / "results/report/reproduction.md").read_text()
    for run in ("opsd", "opsd-seed43", "reopold"):
        adapter = workdir / f"results/training/tiny_qwen3/{run}-step8/adapter/adapter_model.safetensors"
        saved = next((workdir / f"results/training/tiny_qwen3/{run}/checkpoints").glob("*/step-000008/adapter_model.safetensors"))
        assert adapter.read_bytes() == saved.read_bytes()
    proc = run_snakemake(["-n", "--directory", str(workdir), "--config", "evaluation={sweep_steps: [8], sweep_tables: [main, baselines]}"])
    planned = job_counts(proc.stdout + proc.stderr)
    assert "train" not in planned and planned["step_adapter"] == 2 and planned["sweep"] == 1, planned  # ToDi, GKD: the new table


@pytest.mark.workflow
def test_tiny_run_records_provenance_and_a_reproduction_report(tiny_run):
    from pwopsd.io import sha256_file

    workdir, _ = tiny_run
    prov = json.loads((workdir / "results/tables/main_4b.provenance.json").read_text())
    assert prov["rule"] == "table" and prov["versions"]["torch"] and prov["params"]["spec"]["kind"] == "main"
    assert prov["datasets_sha256"]["arith_l2"] == sha256_file(workdir / "results/data/benchmarks/arith_l2.parquet")
    metrics = "results/metrics/tiny_qwen3/opsd/arith_l1/seed-1.json"
    assert prov["inputs_sha256"][metrics] == sha256_file(workdir / metrics)
    assert prov["models"]["tiny_qwen3"]["built_by"] == "tiny"
    assert prov["pinned_kernel_path"] == "avx2"  # tiny mode's cpu_kernel_path, in every job's environment
    build = json.loads((workdir / "results/models/tiny_qwen3/build_report.json").read_text())
    assert build["cpu_capability"] == "AVX2"  # the path torch took
    for stem in ("tables/branch_auroc", "figures/branch_auroc", "figures/pwopsd_schedules", "metrics/summary",
                 "report/reproduction"):
        assert json.loads((workdir / f"results/{stem}.provenance.json").read_text())["versions"]
    report = (workdir / "results/report/reproduction.md").read_text()
    assert "**Tiny mode**" in report and "Reproduced numbers only" in report
    assert "| tiny_qwen3 | pwopsd_moderate | mean | avg |" in report and "residual_auroc" in report


@pytest.mark.workflow
def test_tiny_html_report_shows_every_table_and_figure(tiny_run):
    import base64

    workdir, _ = tiny_run
    run_snakemake(["--directory", str(workdir), "--report", str(workdir / "report.html")])
    html = (workdir / "report.html").read_text()
    results = json.loads(re.search(r"var results = (\{.*?\});\n", html, re.S).group(1))
    expected = [f"results/tables/{t}.{ext}" for t in ("main_4b", "schedules_4b", "cross_model", "ablation_4b", "branch_auroc")
                for ext in ("tex", "csv")]
    expected += [f"results/figures/{f}.pdf" for f in ("branch_auroc", "branch_auroc_scatter", "pwopsd_schedules",
                                                      "training_curves_tiny_qwen3")]
    expected += ["results/report/reproduction.md", "results/report/reproduction.pdf", "results/tables/significance_main_4b.tex",
                 "results/figures/deltas_main_4b.pdf", "results/tables/sweep_main_4b.tex", "results/figures/sweep_main_4b.pdf"]
    assert set(expected) <= set(results), set(expected) - set(results)
    for path in expected:
        entry = results[path]
        assert len(entry["caption"]) > 50, path
        payload = base64.b64decode(entry["data_uri"].split("base64,", 1)[1])
        assert payload == (workdir / path).read_bytes(), path


@pytest.mark.workflow
def test_a_training_seed_added_in_the_config_reruns_only_its_chain_and_the_tables(tiny_run, tmp_path):
    workdir, _ = tiny_run
    overlay = tmp_path / "seed.yaml"
    overlay.write_text("methods:\n  opsd: {seeds: [42, 43, 44]}\n")
    proc = run_snakemake(["-n", "--directory", str(workdir), "--configfile", str(overlay)])
    out = proc.stdout + proc.stderr
    counts = job_counts(out)
    sweep = {"step_adapter", "merge_step_adapter", "generate_sweep_step", "grade_sweep_step", "sweep"}  # Table 2's sweep
    assert {r for r in counts if r != "total"} <= {"train", "merge_adapter", "generate", "grade", "aggregate_metrics", "table",
                                                  "significance", "training_curves", "reproduction_report", "all"} | sweep, counts
    assert counts["train"] == counts["merge_adapter"] == counts["generate"] == counts["grade"] == 1
    assert all(counts[r] == 1 for r in sweep), counts  # the new run at the swept step 8 too
    assert set(re.findall(r"wildcards: model=\w+, (?:method|checkpoint)=([\w-]+)", out)) == {"opsd-seed44", "opsd-seed44-step8"}
    # the tables that show OPSD, not the schedules table (no OPSD row); all significance tables (OPSD is their baseline)
    tables = set(re.findall(r"rule table:\s*\n\s*input:[^\n]*\n\s*output: results/tables/(\w+)\.tex", out))
    assert tables == {"main_4b", "cross_model", "ablation_4b", "baselines_4b"}


def test_tiny_run_tracks_training_evaluation_and_diagnostic(tiny_run):
    """The tiny run with tracking on (W&B offline, tests/conftest.py): each training run's tracked
    steps are its train_log.jsonl, each grade job's tracked metrics its metrics files, the
    diagnostic's tracked AUROCs those of branch_auroc.json."""
    from pwopsd.tracking import training_run_name
    from tracker_stores import wandb_offline_runs

    workdir, _ = tiny_run
    runs = {r["name"]: r for r in wandb_offline_runs(workdir / "results" / "tracking").values()}
    logs = sorted((workdir / "results" / "training").glob("*/*/train_log.jsonl"))
    assert len(logs) >= 10
    for path in logs:
        model, run = path.parts[-3], path.parts[-2]
        tracked = runs[training_run_name(model, run)]
        assert tracked["job_type"] == "train" and tracked["config"]["run"] == run
        logged = [json.loads(x) for x in path.read_text().splitlines()]
        assert [s for s, _ in tracked["history"]] == [x["step"] for x in logged], run
        for (_, values), row in zip(tracked["history"], logged):
            assert values == pytest.approx({k: float(v) for k, v in row.items() if k != "step"}, rel=1e-12), run
    for metrics_dir in sorted((workdir / "results" / "metrics").glob("*/*")):
        model, checkpoint = metrics_dir.parts[-2], metrics_dir.parts[-1]
        group = f"{model}/base" if checkpoint == "base" else training_run_name(model, checkpoint)
        (tracked,) = [r for name, r in runs.items() if name.startswith(f"{group}/eval")]
        (step, values), = tracked["history"]
        for path in metrics_dir.glob("*/seed-*.json"):
            summary = json.loads(path.read_text())
            for key, value in summary["metrics_pct"].items():
                assert values[f"{summary['benchmark']}/seed-{summary['seed_name']}/{key}"] == pytest.approx(value), path
    diagnostic = json.loads(next((workdir / "results" / "diagnostic").glob("*/branch_auroc.json")).read_text())
    (tracked,) = [r for name, r in runs.items() if name.endswith("/diagnostic")]
    values = tracked["history"][0][1]
    assert {f"auroc/{row['score']}": row["auroc"] for row in diagnostic["scores"]} == pytest.approx(
        {k: v for k, v in values.items() if k.startswith("auroc/")})


def test_a_command_line_override_replans_with_the_typed_value(tiny_run):
    """`--config 'evaluation={n: 3}'` on the finished run: every generate job is planned again for
    the integer 3 (its params), and nothing upstream of generation (no training, no model build)."""
    workdir, _ = tiny_run
    proc = run_snakemake(["-n", "--directory", str(workdir), "--config", "evaluation={n: 3}"])
    out = proc.stdout + proc.stderr
    counts = job_counts(out)
    assert "train" not in counts and "build_tiny_model" not in counts and counts["generate"] >= 1, counts
    planned = re.findall(r"reason: Params have changed since last execution:.*? now: \{'n': (\S+?),", out)
    assert planned and set(planned) == {"3"} and len(planned) == counts["generate"] + counts.get("generate_sweep_step", 0), out


@pytest.mark.workflow
def test_tiny_rerun_does_no_work(tiny_run):
    workdir, _ = tiny_run
    proc = run_snakemake(["-n", "--directory", str(workdir)])
    assert "Nothing to be done" in proc.stdout + proc.stderr


def test_scripts_run_standalone_with_the_rules_inputs_and_params(tmp_path):
    shutil.copytree(REPO / "tiny" / "config", tmp_path / "config")
    proc = subprocess.run([sys.executable, str(REPO / "workflow/scripts/prepare_dataset.py"), "--directory", str(tmp_path),
                           "benchmark=arith_l3"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    df = pd.read_parquet(tmp_path / "results/data/benchmarks/arith_l3.parquet")
    assert len(df) == 12 and set(df["level"]) == {3}
    assert "12 rows" in (tmp_path / "logs/data/prepare_benchmark/arith_l3.log").read_text()


@pytest.mark.long
def test_a_local_data_file_is_a_declared_input_and_its_errors_reach_the_console(tmp_path):
    """Editing a local benchmark file reruns its prepare job (a stale table would be a wrong result
    with exit code 0); a bad file fails the job with the one-line cause on Snakemake's console."""
    import yaml

    shutil.copytree(REPO / "tiny" / "config", tmp_path / "config")
    cfg_path = tmp_path / "config" / "config.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg["benchmarks"]["probe"] = {"source": {"kind": "local", "path": "probe.jsonl"}, "columns": {"id": "id"}}
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    rows = [{"id": i, "problem": f"Compute {i} + 1.", "answer": str(i + 1)} for i in range(3)]
    probe = tmp_path / "probe.jsonl"
    probe.write_text("".join(json.dumps(r) + "\n" for r in rows))
    target = "results/data/benchmarks/probe.parquet"
    # Snakemake's own pace for these one-job runs: the default profile's (100 jobs per 5 s) keeps a
    # run alive up to 5 s after its last job (docs/decisions.md, "Snakemake's scheduler"); three
    # such waits were a third of this test's time.
    quick = ["--max-jobs-per-timespan", "100/1s"]
    run_snakemake(["-c1", *quick, "--directory", str(tmp_path), target])
    assert len(pd.read_parquet(tmp_path / target)) == 3
    assert "Nothing to be done" in run_snakemake(["-n", "--directory", str(tmp_path), target]).stdout
    rows[1]["answer"] = "99"
    probe.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dry = run_snakemake(["-n", "--directory", str(tmp_path), target])
    assert "prepare_benchmark" in dry.stdout and "Updated input files" in dry.stdout + dry.stderr, dry.stdout
    run_snakemake(["-c1", *quick, "--directory", str(tmp_path), target])
    assert pd.read_parquet(tmp_path / target)["answer"].tolist() == ["1", "99", "3"]
    rows[2]["answer"] = None
    probe.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = run_snakemake(["-c1", *quick, "--directory", str(tmp_path), target], check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    cause = [line for line in out.splitlines() if line.startswith("pwopsd job failed: DataError:")]
    assert len(cause) == 1 and "benchmarks.probe" in cause[0] and "probe.jsonl" in cause[0], out[-3000:]
    assert not (tmp_path / target).exists()  # Snakemake removed the stale table; nothing half-written replaced it


@pytest.mark.workflow
def test_a_second_copy_of_a_running_training_stops_at_once_naming_the_first(tiny_run, tmp_path):
    """A lost Snakemake head restarted with --rerun-incomplete while the old job still runs: the
    train script of the second copy (run standalone, the rule's own inputs and params) stops before
    training, naming the copy that holds the run, and writes no checkpoint."""
    from conftest import copy_tiny_inputs
    from test_keys import HOLD

    workdir, _ = tiny_run
    shutil.copytree(REPO / "tiny" / "config", tmp_path / "config")
    copy_tiny_inputs(workdir, tmp_path)
    run = tmp_path / "results/training/tiny_qwen3/opsd"
    first = subprocess.Popen([sys.executable, "-c", HOLD, str(run / "adapter")], stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "held"
        second = subprocess.run([sys.executable, str(REPO / "workflow/scripts/train.py"), "--directory", str(tmp_path),
                                 "model=tiny_qwen3", "method=opsd"], capture_output=True, text=True, cwd=tmp_path,
                                timeout=600)
    finally:
        first.kill()
        first.wait()
    assert second.returncode != 0
    cause = [line for line in second.stderr.splitlines() if line.startswith("pwopsd job failed: WriterLockedError:")]
    assert len(cause) == 1 and "training tiny_qwen3/opsd is already running" in cause[0], second.stderr[-2000:]
    assert f"pid {first.pid}" in cause[0]
    assert not list(run.glob("checkpoints/*/step-*")) and not (run / "adapter").exists()
