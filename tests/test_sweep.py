"""The checkpoint sweep (beyond the paper; pwopsd.report.sweep, pwopsd.config.design, the step
adapter of pwopsd.training.job): checkpoint names, the sweep's numbers against the significance
tables' and hand-computed ranks, the sign check of published differences, the adapter of a swept
step found by content, and the config checks."""

import shutil

import numpy as np
import pandas as pd
import pytest

from pwopsd.config import ConfigError, checkpoint_seed_names, merge_configs, read_yaml_strict, split_checkpoint, step_checkpoint, validate_config
from pwopsd.report.significance import holm, significance_frame
from pwopsd.report.sweep import runs_at_step, sign_agreement, sweep_frame

from conftest import REPO


def test_checkpoint_names_round_trip():
    for run in ("opsd", "opsd-seed43", "pwopsd_moderate"):
        assert split_checkpoint(step_checkpoint(run, 25)) == (run, 25)
        assert split_checkpoint(run) == (run, None)
    assert runs_at_step({"a": ["a", "a-seed2"]}, 50, 100) == {"a": ["a-step50", "a-seed2-step50"]}
    assert runs_at_step({"a": ["a"]}, 100, 100) == {"a": ["a"]}


def _summaries(values: dict[str, float], benchmarks=("b1", "b2"), problems=12, seeds=("1", "2"), seed=0):
    """Per-seed metrics of checkpoints whose problems score around ``values[checkpoint]``."""
    rng = np.random.default_rng(seed)
    out = []
    for ckpt, level in values.items():
        for b in benchmarks:
            for s in seeds:
                out.append({"model": "m", "checkpoint": ckpt, "benchmark": b, "seed_name": s,
                            "problems": [{"problem_id": f"q{i}", "avg": float(np.clip(level + rng.normal(0, 0.05), 0, 1))}
                                         for i in range(problems)]})
    return out


def test_the_sweep_equals_the_significance_tables_at_each_step_with_holm_over_the_sweep():
    # base (baseline) and x; x is ahead at step 4, behind at the evaluation step 8
    values = {"base": 0.3, "base-step4": 0.3, "x": 0.2, "x-step4": 0.5, "y": 0.4, "y-step4": 0.1}
    summaries = _summaries(values)
    comparisons = [("m", "x", "base"), ("m", "y", "base")]
    runs = {"base": ["base"], "x": ["x"], "y": ["y"]}
    frame = sweep_frame(summaries, comparisons, ["b1", "b2"], ["avg"], runs, [4, 8], 8)
    at_eval = significance_frame(summaries, comparisons, ["b1", "b2"], ["avg"], runs=runs)
    rows = frame[(frame["step"] == 8) & frame["delta"].notna()].set_index(["method", "benchmark"])
    for _, r in at_eval.iterrows():
        assert rows.loc[(r["method"], r["benchmark"]), "delta"] == pytest.approx(r["delta"])
        assert rows.loc[(r["method"], r["benchmark"]), "p"] == pytest.approx(r["p"])
    tested = frame.dropna(subset=["delta"])
    np.testing.assert_allclose(tested["p_holm"], holm(tested["p"]))  # one family: every step and method of the metric
    mean = frame[frame["benchmark"] == "mean"].set_index(["method", "step"])
    assert [mean.loc[(m, 8), "rank"] for m in ("y", "base", "x")] == [1, 2, 3]
    assert [mean.loc[(m, 4), "rank"] for m in ("x", "base", "y")] == [1, 2, 3]
    assert mean.loc[("x", 4), "best_step"] == 4 and mean.loc[("y", 8), "best_step"] == 8
    assert not mean.loc[("x", 8), "rank_holds"] and mean.loc[("base", 8), "rank_holds"]
    assert mean.loc[("x", 4), "value"] == pytest.approx(100 * np.mean(
        [p["avg"] for s in summaries if s["checkpoint"] == "x-step4" for p in s["problems"]]))
    assert mean["low"].lt(mean["value"]).all() and mean["value"].lt(mean["high"]).all()
    assert np.isnan(mean.loc[("base", 8), "delta"]) and mean.loc[("x", 8), "delta"] < 0 < mean.loc[("x", 4), "delta"]


def test_sign_agreement_lists_the_steps_with_the_papers_sign():
    verdicts = pd.DataFrame([{"model": "m", "method": "x", "baseline": "base", "benchmark": "b1", "metric": "avg",
                              "paper_delta": 2.0}])
    sweep = pd.DataFrame([{"model": "m", "method": "x", "baseline": "base", "benchmark": "b1", "metric": "avg", "step": s, "delta": d}
                          for s, d in ((25, -1.0), (50, 0.5), (100, 3.0))]
                         + [{"model": "m", "method": "base", "baseline": "base", "benchmark": "b1", "metric": "avg", "step": 25,
                             "delta": np.nan}])
    agreement = sign_agreement(verdicts, sweep)
    assert agreement.loc[0, "same_sign_steps"] == [50, 100] and agreement.loc[0, "other_sign_steps"] == [25]


def _save(folder, step, weights: bytes):
    d = folder / f"step-{step:06d}"
    d.mkdir(parents=True)
    (d / "adapter_model.safetensors").write_bytes(weights)
    (d / "adapter_config.json").write_text("{}")
    (d / "trainer_state.pt").write_bytes(b"state")


def test_the_adapter_of_a_swept_step_comes_from_the_runs_own_checkpoint_folder(tmp_path):
    from pwopsd.training.job import export_step

    root = tmp_path / "checkpoints"
    for key, tag in (("aaa", b"old"), ("bbb", b"new")):  # an older run key's folder sorts first
        _save(root / key, 8, b"step8-" + tag)
        _save(root / key, 16, b"step16-" + tag)
    exported = tmp_path / "adapter"
    exported.mkdir()
    (exported / "adapter_model.safetensors").write_bytes(b"step16-new")
    (exported / "adapter_config.json").write_text("{}")
    (exported / ".snakemake_timestamp").write_text("")  # Snakemake's mark in a directory() output
    out = tmp_path / "out"
    assert export_step(root, exported, 16, 8, out) == root / "bbb" / "step-000008"
    assert (out / "adapter_model.safetensors").read_bytes() == b"step8-new" and not (out / "trainer_state.pt").exists()
    with pytest.raises(FileNotFoundError, match="step 4 was not saved"):
        export_step(root, exported, 16, 4, tmp_path / "out4")
    _save(root / "ccc", 16, b"step16-new")  # the same run trained further (another stop_at: another run key)
    _save(root / "ccc", 24, b"step24-new")
    assert export_step(root, exported, 16, 24, tmp_path / "out24") == root / "ccc" / "step-000024"
    # a run that parts from it only after step 16 (REOPOLD's t_switch, say): which was exported cannot be told
    _save(root / "ddd", 16, b"step16-new")
    _save(root / "ddd", 24, b"step24-other")
    with pytest.raises(FileNotFoundError, match="cannot be told"):
        export_step(root, exported, 16, 24, tmp_path / "out24b")
    assert not (tmp_path / "out24b").exists()
    shutil.rmtree(root / "ddd")
    (exported / "adapter_model.safetensors").write_bytes(b"trained again")
    with pytest.raises(FileNotFoundError, match="rerun its training"):
        export_step(root, exported, 16, 8, tmp_path / "out2")
    assert not (tmp_path / "out2").exists() and not (tmp_path / "out4").exists()


def test_sweep_settings_are_checked_against_the_saved_steps_and_tables():
    base = read_yaml_strict(REPO / "config" / "config.yaml")
    cfg = validate_config(merge_configs(base, read_yaml_strict(REPO / "config" / "sweep.yaml")))
    assert cfg["evaluation"]["sweep_steps"] == [25, 50, 75, 125, 150]
    with pytest.raises(ConfigError, match=r"sweep_tables.1: 'nope' is not one of"):
        validate_config(merge_configs(base, {"evaluation": {"sweep_steps": [50], "sweep_tables": ["main", "nope"]}}))
    with pytest.raises(ConfigError, match=r"sweep_steps.0: 30 is not a saved training step.*\n.*sweep_steps.1: 175"):
        validate_config(merge_configs(base, {"evaluation": {"sweep_steps": [30, 175]}}))
    with pytest.raises(ConfigError, match=r"sweep_seeds.0: 7 is not one of evaluation.seeds"):
        validate_config(merge_configs(base, {"evaluation": {"sweep_steps": [50], "sweep_seeds": [7]}}))
    cfg = validate_config(merge_configs(base, {"evaluation": {"sweep_steps": [50], "sweep_seeds": [2, "main"]}}))
    assert checkpoint_seed_names(cfg, "opsd-step50") == ["main", "2"] and checkpoint_seed_names(cfg, "opsd") == ["main", "1", "2"]
    no_baselines = {k: v for k, v in base["tables"].items() if k != "baselines"}
    with pytest.raises(ConfigError, match=r"sweep_tables.0: 'baselines' is not a configured table"):
        validate_config({**merge_configs(base, {"evaluation": {"sweep_steps": [50], "sweep_tables": ["baselines"]}}),
                         "tables": no_baselines})
