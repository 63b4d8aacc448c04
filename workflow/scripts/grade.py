"""Rule grade: grade one checkpoint's generations for one seed on every benchmark; write graded
samples and per-seed metrics."""

from pwopsd.evaluation.pipeline import grade_run
from pwopsd.evaluation.grading import GraderPool, pool_settings
from pwopsd.io import read_parquet, write_json, write_parquet
from pwopsd.runtime import setup_logging, versions
from pwopsd.standalone import standalone_snakemake


def main(snakemake):
    log = setup_logging(snakemake.log[0])
    timeout, maj_budget, options = pool_settings(snakemake.params.grading)
    wc = snakemake.wildcards
    with GraderPool(workers=snakemake.threads, timeout=timeout, options=options, progress=True) as pool:
        for name, gens, bench, graded_out, metrics_out in zip(snakemake.params.benchmarks, snakemake.input.generations,
                                                              snakemake.input.benchmarks, snakemake.output.graded,
                                                              snakemake.output.metrics):
            meta = {"model": wc.model, "checkpoint": wc.checkpoint, "benchmark": name, "seed_name": wc.seed,
                    "grading_options": snakemake.params.grading, "versions": versions()}
            graded, summary = grade_run(read_parquet(gens), read_parquet(bench), pool=pool, meta=meta, maj_budget=maj_budget)
            write_parquet(graded, graded_out, metadata=meta)
            write_json(summary, metrics_out)
            log.info("%s: %s", metrics_out, summary["metrics_pct"])


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("grade"))  # noqa: F821
