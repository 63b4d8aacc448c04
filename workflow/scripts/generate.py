"""Rule generate: sample a checkpoint on a benchmark with one evaluation seed."""

import pandas as pd

from pwopsd.config import backend_options
from pwopsd.models import read_manifest
from pwopsd.runtime import set_threads, setup_logging, versions
from pwopsd.sampling import run_generation
from pwopsd.standalone import standalone_snakemake


def main(snakemake):
    setup_logging(snakemake.log[0])
    set_threads(snakemake.threads)
    wc = snakemake.wildcards
    run_generation(
        benchmark=pd.read_parquet(snakemake.input.benchmark),
        manifest=read_manifest(snakemake.input.model),
        settings=snakemake.params.sampling,
        seed=snakemake.params.seed,
        chat_template=snakemake.params.chat_template,
        dtype=snakemake.params.dtype,
        backend_name=snakemake.params.backend,
        backend_options=backend_options(snakemake.config, wc.model),
        output=snakemake.output.generations,
        metadata={"model": wc.model, "checkpoint": wc.checkpoint, "benchmark": wc.benchmark,
                  "seed_name": wc.seed, "versions": versions()},
    )


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("generate"))  # noqa: F821
