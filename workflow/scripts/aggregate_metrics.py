"""Rule aggregate_metrics: per-seed metrics of every evaluated run -> tidy tables over seeds."""

from pwopsd.evaluation.pipeline import aggregate
from pwopsd.io import atomic_path, read_json, write_parquet
from pwopsd.runtime import setup_logging, write_job_provenance
from pwopsd.standalone import standalone_snakemake


def main(snakemake):
    log = setup_logging(snakemake.log[0])
    summaries = [read_json(path) for path in snakemake.input.metrics]
    per_seed, agg = aggregate(summaries, list(snakemake.params.benchmarks))
    with atomic_path(snakemake.output.per_seed) as tmp:
        per_seed.to_csv(tmp, index=False)
    with atomic_path(snakemake.output.summary) as tmp:
        agg.drop(columns=["values", "seeds"]).to_csv(tmp, index=False, float_format="%.6f")
    write_parquet(agg, snakemake.output.summary_parquet)
    log.info("aggregated %d seed-level results into %d rows", len(summaries), len(agg))
    write_job_provenance(snakemake, snakemake.output.provenance)


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("aggregate_metrics"))  # noqa: F821
