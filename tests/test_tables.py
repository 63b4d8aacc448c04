"""Table layout and bolding on fixed numbers (the paper's Table 2 columns reproduce its bold marks),
and Figure 2 with its data."""

import math
import re

import pandas as pd
import pytest

from pwopsd.report.figures import schedules_figure
from pwopsd.report.tables import ablation_table, bold_flags, cell, cross_model_table, method_benchmark_table

# Qwen3-4B Table 2 of the paper, MATH-500 Pass@12 and AIME 2024 Avg@12 / Maj@12 columns:
# (opsd, eopd, reopold, pwopsd_moderate, pwopsd_aggressive) -> (mean, std, bold in the paper)
PAPER = {
    ("math500", "pass"): [(98.00, 0.35, False), (98.33, 0.23, True), (98.40, 0.20, True), (98.40, 0.00, True), (98.40, 0.20, True)],
    ("aime2024", "avg"): [(75.19, 0.42, False), (73.61, 2.17, False), (73.98, 0.42, False), (76.20, 0.58, True), (75.19, 0.85, False)],
    ("aime2024", "maj"): [(80.00, 0.00, True)] * 5,
}
ROWS = [("opsd", "OPSD"), ("eopd", "EOPD"), ("reopold", "REOPOLD"), ("pwopsd_moderate", "PW-OPSD Moderate"),
        ("pwopsd_aggressive", "PW-OPSD Aggressive")]


def summary_from_paper():
    recs = []
    for (bench, metric), vals in PAPER.items():
        for (ckpt, _), (mean, std, _) in zip(ROWS, vals):
            recs.append({"model": "qwen3_4b", "checkpoint": ckpt, "benchmark": bench, "metric": metric, "mean": mean, "std": std})
    return pd.DataFrame(recs)


def test_bold_rule_reproduces_the_papers_marks():
    for key, vals in PAPER.items():
        assert bold_flags([m for m, _, _ in vals]) == [b for _, _, b in vals], key


def test_bold_rule_edge_cases():
    assert bold_flags([1.0, 0.9, 0.8999]) == [True, True, False]  # within 0.1 inclusive
    assert bold_flags([None, float("nan"), 2.0]) == [False, False, True]
    assert bold_flags([None]) == [False]


def test_cell_format():
    assert cell(95.333, 0.0789) == "$95.33 \\pm 0.08$"
    assert cell(80.0, 0.0, bold=True) == "$\\mathbf{80.00 \\pm 0.00}$"
    assert cell(None, None) == "--" and cell(1.5, float("nan")) == "$1.50$"


def test_method_benchmark_table_layout():
    tex = method_benchmark_table(summary_from_paper(), model="qwen3_4b", rows=ROWS,
                                 benchmarks=[("math500", "MATH-500"), ("aime2024", "AIME 2024")],
                                 caption="Qwen3-4B", label="tab:main-4b")
    assert tex.count("\\multirow{2}{*}") == 5 and tex.count("\\midrule") == 5
    assert "Method & Benchmark & Pass@12 & Avg@12 & Maj@12 \\\\" in tex
    line = next(ln for ln in tex.splitlines() if "PW-OPSD Moderate" in ln)
    assert line.startswith("\\multirow{2}{*}{PW-OPSD Moderate} & MATH-500 & $\\mathbf{98.40 \\pm 0.00}$")
    assert "$76.20 \\pm 0.58$" not in tex and "$\\mathbf{76.20 \\pm 0.58}$" in tex
    assert "--" in tex  # AIME 2024 Pass@12 and MATH-500 Avg/Maj are not in the fixture
    rows = [ln for ln in tex.splitlines() if ln.endswith("\\\\")]
    assert all(ln.count("&") == 4 for ln in rows)
    assert tex.count("\\begin{tabular}{llccc}") == 1 and tex.rstrip().endswith("\\end{table}")


def test_cross_model_table_bolds_within_model():
    recs = []
    for model, base in (("a", 50.0), ("b", 10.0)):
        for ckpt, delta in (("opsd", 0.0), ("pwopsd_moderate", 0.5)):
            for bench in ("x", "y", "mean"):
                recs.append({"model": model, "checkpoint": ckpt, "benchmark": bench, "metric": "avg", "mean": base + delta, "std": 0.1})
    tex = cross_model_table(pd.DataFrame(recs), models=[("a", "Model A"), ("b", "Model B")],
                            methods=[("opsd", "OPSD"), ("pwopsd_moderate", "PW-OPSD")], benchmarks=[("x", "X"), ("y", "Y")],
                            caption="c", label="tab:cross-model")
    assert "Model & Method & X & Y & Avg@12 \\\\" in tex
    assert tex.count("\\mathbf{10.50") == 3 and tex.count("\\mathbf{50.50") == 3  # each model's winner bold
    assert "\\mathbf{10.00" not in tex


def test_ablation_table():
    recs = [{"model": "m", "checkpoint": c, "benchmark": "aime2024", "metric": "avg", "mean": v, "std": 0.5}
            for c, v in (("opsd", 75.19), ("uniform_perseq", 74.72), ("posw_global", 74.54), ("pwopsd_moderate", 76.20))]
    tex = ablation_table(pd.DataFrame(recs), model="m", benchmark=("aime2024", "AIME 2024"), caption="c", label="tab:abl",
                         cells=[("opsd", "Uniform / global"), ("uniform_perseq", "Uniform / per-seq"),
                                ("posw_global", "Pos-w / global"), ("pwopsd_moderate", "Pos-w / per-seq")])
    assert re.findall(r"\\mathbf\{([0-9.]+)", tex) == ["76.20"]


def test_schedules_figure_writes_pdf_and_its_data(tmp_path):
    from test_losses import SCHEDULES  # the paper config's four schedules

    curves = schedules_figure(SCHEDULES, tmp_path / "f.pdf", tmp_path / "f.csv")
    assert (tmp_path / "f.pdf").read_bytes()[:5] == b"%PDF-"
    data = pd.read_csv(tmp_path / "f.csv")
    assert list(data.columns) == ["r"] + list(SCHEDULES)
    row = data[data["r"].round(6) == 0.3].iloc[0]
    assert row["moderate"] == pytest.approx(0.625, abs=1e-6)  # w(tau) = (1 + w_min) / 2
    for name, (w_min, tau, s) in SCHEDULES.items():
        assert data[name].iloc[0] == pytest.approx(w_min + (1 - w_min) / (1 + math.exp(tau / s)), abs=1e-6)
    assert len(curves) == 201


def test_tables_compile_with_pdflatex_when_available(tmp_path):
    import shutil
    import subprocess

    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex not installed (the structural checks above still run)")
    tex = method_benchmark_table(summary_from_paper(), model="qwen3_4b", rows=ROWS, benchmarks=[("math500", "MATH-500")],
                                 caption="c", label="t")
    doc = ("\\documentclass{article}\\usepackage{booktabs,multirow,graphicx,amsmath}\\begin{document}"
           + tex + "\\end{document}\n")
    (tmp_path / "t.tex").write_text(doc)
    proc = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "t.tex"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:]
