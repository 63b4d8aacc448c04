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
