"""Rule generate: sample a checkpoint on a benchmark with one evaluation seed."""

import pandas as pd

from pwopsd.models import read_manifest
from pwopsd.runtime import set_threads, setup_logging, versions
from pwopsd.sampling import SamplingConfig, run_generation


def main(snakemake):
    setup_logging(snakemake.log[0])
    set_threads(snakemake.threads)
    run_generation(
        benchmark=pd.read_parquet(snakemake.input.benchmark),
        manifest=read_manifest(snakemake.input.model),
        model_entry=snakemake.params.model_entry,
        evaluation=snakemake.params.evaluation,
        sampling=SamplingConfig.from_evaluation(snakemake.params.evaluation, snakemake.params.seed),
        backend_name=snakemake.params.backend,
        output=snakemake.output.generations,
        metadata={
            "model": snakemake.wildcards.model,
            "checkpoint": snakemake.wildcards.checkpoint,
            "benchmark": snakemake.wildcards.benchmark,
            "seed_name": snakemake.wildcards.seed,
            "versions": versions(),
        },
    )


if __name__ == "__main__":
    main(snakemake)  # noqa: F821
