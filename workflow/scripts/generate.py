"""Rule generate: sample a checkpoint with one evaluation seed on every benchmark."""

from pwopsd.generation.sampling import run_generations
from pwopsd.io import read_parquet
from pwopsd.models import read_manifest
from pwopsd.runtime import set_threads, setup_logging, versions
from pwopsd.settings import execution_settings
from pwopsd.standalone import standalone_snakemake


def main(snakemake):
    setup_logging(snakemake.log[0])
    set_threads(snakemake.threads)
    wc = snakemake.wildcards
    run_generations(
        benchmarks=[(name, read_parquet(table), out) for name, table, out in
                    zip(snakemake.params.benchmarks, snakemake.input.benchmarks, snakemake.output.generations)],
        manifest=read_manifest(snakemake.input.model),
        settings=snakemake.params.sampling,
        seed=snakemake.params.seed,
        chat_template=snakemake.params.chat_template,
        dtype=snakemake.params.dtype,
        backend_name=snakemake.params.backend,
        backend_options=execution_settings(snakemake.config, wc.model)["backend_options"],
        metadata={"model": wc.model, "checkpoint": wc.checkpoint, "seed_name": wc.seed, "versions": versions()},
    )


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("generate"))  # noqa: F821
