"""Extract the paper's published numbers (Tables 1-5) from its LaTeX source into
workflow/reference/paper_results.csv, keyed by this project's config names.

    python tools/extract_paper_results.py ../shared/paper/pw_opsd_paper.tex

Run once when the paper changes; the CSV is committed (tests re-extract and compare when the
paper source is available).
"""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "workflow" / "reference" / "paper_results.csv"
COLUMNS = ["paper_table", "model", "method", "benchmark", "metric", "mean", "std", "ci_low", "ci_high"]
BENCHMARKS = {"MATH-500": "math500", "AIME 2024": "aime2024", "AIME 2025": "aime2025", "HMMT 2025": "hmmt_feb2025"}
METHODS = {"\\opsd{}~\\citep{zhao2026opsd}": "opsd", "\\eopd{}~\\citep{jin2026eopd}": "eopd",
           "REOPOLD~\\citep{ko2026scalingreasoningefficientlyrelaxed}": "reopold",
           "\\pwopsd{} Moderate (ours)": "pwopsd_moderate", "\\pwopsd{} Aggressive (ours)": "pwopsd_aggressive",
           "Mild": "pwopsd_mild", "Moderate": "pwopsd_moderate", "Sharp": "pwopsd_sharp", "Aggressive": "pwopsd_aggressive"}
MODELS = {"Qwen3-4B": "qwen3_4b", "DSR1-L8B": "dsr1_llama_8b", "Olmo-3-7B-Think": "olmo3_7b_think"}
CELL = r"\$(?:\\mathbf\{)?([\d.]+)(?: \\pm ([\d.]+))?\}?\$"


def block(tex: str, start: str, end: str = "\\end{tabular") -> str:
    i = tex.index(start)
    return tex[i : tex.index(end, i)]


def method_benchmark_rows(text: str, table: str) -> list[dict]:
    rows, method = [], None
    for line in text.splitlines():
        m = re.match(r"\\multirow\{4\}\{\*\}\{(.*)\}\s*$", line.strip())
        if m:
            method = METHODS[m.group(1)]
            continue
        m = re.match(r"& (MATH-500|AIME 2024|AIME 2025|HMMT 2025)\s*&(.*)\\\\", line.strip())
        if m and method:
            cells = re.findall(CELL, m.group(2))
            for metric, (mean, std) in zip(("pass", "avg", "maj"), cells):
                rows.append({"paper_table": table, "model": "qwen3_4b", "method": method,
                             "benchmark": BENCHMARKS[m.group(1)], "metric": metric, "mean": mean, "std": std})
    return rows


def extract(tex: str) -> list[dict]:
    rows = []
    # Table 1: branch-viability AUROC
    t1 = block(tex, "\\label{tab:branch-auroc}")
    scores = ["h_full", "mi", "log_kappa", "h_trunc", "early_position"]
    found = re.findall(r"& \$(?:\\mathbf\{)?([\d.]+)\}?\$ & \$(?:\\mathbf\{)?\[([\d.]+), ([\d.]+)\]\}?\$\\\\", t1)
    for score, (auroc, lo, hi) in zip(scores, found):
        rows.append({"paper_table": "Table 1", "model": "qwen3_4b", "method": score, "benchmark": "branch_viability",
                     "metric": "residual_auroc", "mean": auroc, "ci_low": lo, "ci_high": hi})
    rows += method_benchmark_rows(block(tex, "\\label{tab:main-4b}"), "Table 2")
    rows += method_benchmark_rows(block(tex, "Config & Benchmark & Pass@12"), "Table 3")
    # Table 4: cross-model Avg@12 (+ the equal-weight mean)
    t4 = block(tex, "\\label{tab:cross-model}")
    model = None
    for chunk in re.split(r"\n(?=\\multirow|  & \\)", t4):
        m = re.search(r"\\multirow\{2\}\{\*\}\{([^}]*)\}", chunk)
        if m:
            model = MODELS[m.group(1)]
            continue
        m = re.match(r"\s*& (\\opsd\{\}|\\pwopsd\{\} \(\\textbf\{ours\}\))", chunk)
        if m and model:
            method = "opsd" if m.group(1) == "\\opsd{}" else "pwopsd_moderate"
            cells = re.findall(CELL, chunk)
            for bench, (mean, std) in zip(["math500", "aime2024", "aime2025", "hmmt_feb2025", "mean"], cells):
                rows.append({"paper_table": "Table 4", "model": model, "method": method, "benchmark": bench,
                             "metric": "avg", "mean": mean, "std": std})
    # Table 5: 2x2 reduction ablation, AIME 2024 Avg@12
    t5 = block(tex, "\\label{tab:reduction-ablation}")
    cells = {"Uniform / global": "opsd", "Uniform / per-seq": "uniform_perseq", "Pos-w / global": "posw_global",
             "Pos-w / per-seq": "pwopsd_moderate"}
    for label, method in cells.items():
        line = next(x for x in t5.splitlines() if x.startswith(label + " ") or x.startswith(label + "  "))
        mean, std = re.findall(CELL, line)[0]
        rows.append({"paper_table": "Table 5", "model": "qwen3_4b", "method": method, "benchmark": "aime2024",
                     "metric": "avg", "mean": mean, "std": std})
    return rows


def write(rows: list[dict], path: Path = OUT) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in COLUMNS})


if __name__ == "__main__":
    write(extract(Path(sys.argv[1]).read_text()))
    print(f"wrote {OUT}")
