"""Rule grade: grade one generations table; write graded samples and the per-seed metrics."""

import pandas as pd

from pwopsd.evaluation import grade_run
from pwopsd.grading import GraderPool, GradingOptions
from pwopsd.io import write_json, write_parquet
from pwopsd.runtime import setup_logging, versions
from pwopsd.standalone import standalone_snakemake


def main(snakemake):
    log = setup_logging(snakemake.log[0])
    opts = dict(snakemake.params.grading)
    timeout = opts.pop("timeout")
    wc = snakemake.wildcards
    meta = {"model": wc.model, "checkpoint": wc.checkpoint, "benchmark": wc.benchmark, "seed_name": wc.seed,
            "grading_options": snakemake.params.grading, "versions": versions()}
    with GraderPool(workers=snakemake.threads, timeout=timeout, options=GradingOptions(**opts), progress=True) as pool:
        graded, summary = grade_run(pd.read_parquet(snakemake.input.generations), pd.read_parquet(snakemake.input.benchmark),
                                    pool=pool, meta=meta)
    write_parquet(graded, snakemake.output.graded, metadata=meta)
    write_json(summary, snakemake.output.metrics)
    log.info("%s: %s", snakemake.output.metrics, summary["metrics_pct"])


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("grade"))  # noqa: F821
