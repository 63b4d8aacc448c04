"""Rule significance: each method of a table against the baseline, paired by problem (Δ, interval,
p, Holm), as LaTeX + CSV, and the forest plot of the Avg@N differences (+ its data as CSV)."""

from pwopsd.config import plain_label
from pwopsd.io import atomic_path, read_json
from pwopsd.report.figures import deltas_figure
from pwopsd.report.significance import METRICS, significance_frame
from pwopsd.report.tables import significance_table
from pwopsd.runtime import setup_logging, write_job_provenance
from pwopsd.standalone import standalone_snakemake


def main(snakemake):
    log = setup_logging(snakemake.log[0])
    spec = dict(snakemake.params.spec)
    summaries = [read_json(p) for p in snakemake.input.metrics]
    frame = significance_frame(summaries, [tuple(c) for c in spec["comparisons"]], spec["benchmarks"], spec["metrics"],
                               runs={m: list(r) for m, r in spec["runs"].items()}, level=spec["level"])
    tex = significance_table(frame, metric_labels=METRICS, method_labels=spec["method_labels"],
                             model_labels=spec["model_labels"], benchmark_labels=spec["benchmark_labels"], level=spec["level"],
                             n=spec["n"], label=f"tab:significance-{snakemake.wildcards.table.replace('_', '-')}")
    with atomic_path(snakemake.output.tex) as tmp:
        tmp.write_text(tex)
    with atomic_path(snakemake.output.csv) as tmp:
        frame.to_csv(tmp, index=False, float_format="%.6f")
    metric = "avg" if "avg" in spec["metrics"] else spec["metrics"][0]
    deltas_figure(frame, labels={k: plain_label(v) for k, v in spec["method_labels"].items()},
                  benchmark_labels=spec["benchmark_labels"], pdf_path=snakemake.output.pdf,
                  csv_path=snakemake.output.figure_csv, metric=metric)
    log.info("%d comparisons from %d seed-level results; smallest Holm-adjusted p %.3g", len(frame), len(summaries),
             frame["p_holm"].min())
    write_job_provenance(snakemake, snakemake.output.provenance)


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("significance"))  # noqa: F821
