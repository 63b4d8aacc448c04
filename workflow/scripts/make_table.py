"""Rule table: one of Tables 2-5 from the per-seed metrics of its runs (+ the numbers as CSV)."""

from pwopsd.evaluation.pipeline import aggregate
from pwopsd.io import atomic_path, read_json
from pwopsd.runtime import setup_logging, write_job_provenance
from pwopsd.standalone import standalone_snakemake
from pwopsd.report.tables import render_table


def main(snakemake):
    log = setup_logging(snakemake.log[0])
    summaries = [read_json(p) for p in snakemake.input.metrics]
    _, summary = aggregate(summaries, list(snakemake.params.benchmarks))
    tex = render_table(summary, dict(snakemake.params.spec), list(snakemake.params.benchmarks))
    with atomic_path(snakemake.output.tex) as tmp:
        tmp.write_text(tex)
    with atomic_path(snakemake.output.csv) as tmp:
        summary.drop(columns=["values", "seeds"]).to_csv(tmp, index=False, float_format="%.6f")
    log.info("wrote %s from %d seed-level results", snakemake.output.tex, len(summaries))
    write_job_provenance(snakemake, snakemake.output.provenance)


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("table"))  # noqa: F821
