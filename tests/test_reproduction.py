"""Reproduction report: the reference file matches the paper's LaTeX, comparisons flag agreement
by the documented rules, tiny mode shows the reproduced side only."""

import importlib.util

import pandas as pd
import pytest

from conftest import REPO, SHARED, require_shared
from pwopsd.report.reproduction import compare, load_reference, render_markdown, reproduced_values

REFERENCE = REPO / "workflow" / "reference" / "paper_results.csv"


def test_reference_file_is_what_the_paper_says(tmp_path):
    tex = require_shared(SHARED / "paper" / "pw_opsd_paper.tex")
    spec = importlib.util.spec_from_file_location("extract", REPO / "tools" / "extract_paper_results.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.write(mod.extract(tex.read_text()), tmp_path / "ref.csv")
    assert (tmp_path / "ref.csv").read_text() == REFERENCE.read_text()
    ref = load_reference(REFERENCE)
    assert ref.groupby("paper_table").size().to_dict() == {"Table 1": 5, "Table 2": 60, "Table 3": 48, "Table 4": 30,
                                                            "Table 5": 4}
    row = ref[(ref.paper_table == "Table 2") & (ref.method == "pwopsd_moderate") & (ref.benchmark == "aime2024")
              & (ref.metric == "avg")].iloc[0]
    assert (row["mean"], row["std"]) == (76.20, 0.58)
    assert ref[(ref.paper_table == "Table 1") & (ref.method == "early_position")][["mean", "ci_low", "ci_high"]].values.tolist() \
        == [[0.83, 0.66, 0.95]]


def summary(rows):
    return pd.DataFrame([{"model": m, "checkpoint": c, "benchmark": b, "metric": k, "mean": v, "std": s, "n_seeds": 3}
                         for m, c, b, k, v, s in rows])


def test_agreement_rules():
    ref = load_reference(REFERENCE)
    rep = reproduced_values(summary([
        ("qwen3_4b", "opsd", "aime2024", "avg", 75.0, 0.5),       # |d| = 0.19 <= 2*sqrt(0.42^2 + 0.5^2) = 1.31
        ("qwen3_4b", "eopd", "aime2024", "avg", 70.0, 0.5),       # paper 73.61 +- 2.17: |d| = 3.61 <= 4.74
        ("qwen3_4b", "reopold", "aime2024", "avg", 70.0, 0.1),    # paper 73.98 +- 0.42: |d| = 3.98 > 0.86
        ("qwen3_4b", "opsd", "mean", "avg", 70.5, 0.1),           # Table 4 mean has no paper std: 0.23 > 0.2
    ]), {"status": "ok", "scores": [{"score": "early_position", "auroc": 0.7, "ci_low": 0.52, "ci_high": 0.65},
                                    {"score": "mi", "auroc": 0.55, "ci_low": 0.45, "ci_high": 0.70}]},
        diagnostic_model="qwen3_4b")
    cmp = compare(ref, rep)
    got = {(r.paper_table, r.method, r.benchmark): r.within_spread for r in cmp.itertuples() if pd.notna(r.reproduced)}
    assert got[("Table 2", "opsd", "aime2024")] is True and got[("Table 5", "opsd", "aime2024")] is True
    assert got[("Table 2", "eopd", "aime2024")] is True and got[("Table 2", "reopold", "aime2024")] is False
    assert got[("Table 4", "opsd", "mean")] is False
    assert got[("Table 1", "early_position", "branch_viability")] is False  # [0.52, 0.65] vs [0.66, 0.95]
    assert got[("Table 1", "mi", "branch_viability")] is True
    d = cmp[(cmp.paper_table == "Table 2") & (cmp.method == "opsd") & (cmp.benchmark == "aime2024") & (cmp.metric == "avg")]
    assert d["difference"].iloc[0] == pytest.approx(-0.19)
    md = render_markdown(cmp, rep, title_note="x")
    assert "## Table 2" in md and "| **no** |" in md and "published numbers have no reproduced counterpart yet" in md


def test_tiny_mode_shows_the_reproduced_side_only():
    rep = reproduced_values(summary([("tiny_qwen3", "opsd", "arith_l1", "avg", 40.0, 1.0)]), None, diagnostic_model=None)
    cmp = compare(load_reference(REFERENCE), rep)
    assert cmp["reproduced"].isna().all()
    md = render_markdown(cmp, rep, title_note="**Tiny mode**")
    assert "Reproduced numbers only" in md and "| tiny_qwen3 | opsd | arith_l1 | avg | 40.00 ± 1.00 |" in md
    assert "## Table" not in md


def test_other_graders_and_the_other_orientation_are_shown_beside():
    """The comparison uses the verdicts grader's numbers and Table 1's configured orientation; the
    corrected grader's value and the raw AUROC appear beside them in the report."""
    ref = load_reference(REFERENCE)
    rep = reproduced_values(summary([
        ("qwen3_4b", "opsd", "math500", "avg", 95.30, 0.1),
        ("qwen3_4b", "opsd", "math500", "avg/corrected", 95.71, 0.12),
    ]), {"status": "ok", "orientation": "folded",
         "scores": [{"score": "mi", "auroc": 0.56, "ci_low": 0.50, "ci_high": 0.70, "auroc_raw": 0.44, "ci_low_raw": 0.30,
                     "ci_high_raw": 0.55, "auroc_folded": 0.56, "ci_low_folded": 0.50, "ci_high_folded": 0.70}]},
        diagnostic_model="qwen3_4b")
    cmp = compare(ref, rep)
    row = cmp[(cmp.paper_table == "Table 2") & (cmp.method == "opsd") & (cmp.benchmark == "math500") & (cmp.metric == "avg")]
    assert row["reproduced"].iloc[0] == 95.30  # the verdicts grader's value is the one compared
    md = render_markdown(cmp, rep, title_note="x")
    line = next(ln for ln in md.splitlines() if ln.startswith("| qwen3_4b | opsd | math500 | avg | 95.33"))
    assert line.endswith("| corrected: 95.71 ± 0.12 |")
    line = next(ln for ln in md.splitlines() if ln.startswith("| qwen3_4b | mi | branch_viability | residual_auroc | 0.51"))
    assert "0.56 [0.50, 0.70]" in line and line.endswith("| raw: 0.44 [0.30, 0.55] |")


def test_published_differences_are_judged_by_the_reproduced_intervals():
    """The paper's Δ (method minus OPSD, across tables when the method is published elsewhere) beside
    the significance rows: held by the interval or not, interval excluding 0 or not."""
    import pandas as pd

    from pwopsd.report.reproduction import delta_verdicts, render_delta_verdicts

    ref = pd.DataFrame([
        {"paper_table": "Table 2", "model": "q", "method": "opsd", "benchmark": "aime", "metric": "avg", "mean": 40.0},
        {"paper_table": "Table 2", "model": "q", "method": "pw", "benchmark": "aime", "metric": "avg", "mean": 41.0},
        {"paper_table": "Table 3", "model": "q", "method": "mild", "benchmark": "aime", "metric": "avg", "mean": 43.0},
        {"paper_table": "Table 1", "model": "q", "method": "h", "benchmark": "branch_viability", "metric": "residual_auroc", "mean": 0.5}])
    sig = pd.DataFrame([
        {"model": "q", "method": "pw", "baseline": "opsd", "benchmark": "aime", "metric": "avg", "delta": 0.2, "low": -1.5,
         "high": 1.9, "p_holm": 0.8},
        {"model": "q", "method": "mild", "baseline": "opsd", "benchmark": "aime", "metric": "avg", "delta": 0.5, "low": 0.1,
         "high": 0.9, "p_holm": 0.04},
        {"model": "q", "method": "pw", "baseline": "opsd", "benchmark": "aime", "metric": "avg", "delta": 0.2, "low": -1.5,
         "high": 1.9, "p_holm": 0.8},  # the same comparison from another significance table
        {"model": "q", "method": "pw", "baseline": "opsd", "benchmark": "hmmt", "metric": "avg", "delta": 1.0, "low": 0.0,
         "high": 2.0, "p_holm": 0.5}])  # nothing published for it
    v = delta_verdicts(ref, sig).set_index("method")
    assert list(v.index) == ["pw", "mild"]
    assert v.loc["pw", "paper_delta"] == 1.0 and v.loc["pw", "holds_paper_delta"] and not v.loc["pw", "excludes_zero"]
    assert v.loc["mild", "paper_delta"] == 3.0 and v.loc["mild", "paper_tables"] == "Table 3 - Table 2"
    assert not v.loc["mild", "holds_paper_delta"] and v.loc["mild", "excludes_zero"]
    text = render_delta_verdicts(delta_verdicts(ref, sig))
    assert "1 of 2 reproduced intervals hold the paper's difference; 1 exclude 0" in text and "**no**" in text
    assert "No published difference" in render_delta_verdicts(delta_verdicts(ref, sig.iloc[3:]))
