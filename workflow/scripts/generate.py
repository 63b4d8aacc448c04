"""Rule generate: sample a checkpoint on every benchmark with one evaluation seed (or, with
`evaluation.seeds_per_job: all`, every seed)."""

from pwopsd.accelerator import require_job_cuda
from pwopsd.generation.sampling import generation_path, run_generations
from pwopsd.io import one_writer, read_parquet
from pwopsd.models import read_manifest
from pwopsd.runtime import set_threads, setup_logging, versions
from pwopsd.settings import execution_settings
from pwopsd.standalone import standalone_snakemake
from pwopsd.notice import exit_on_notice


def main(snakemake):
    setup_logging(snakemake.log[0])
    set_threads(snakemake.threads)
    require_job_cuda(snakemake)  # asked for GPUs and found none: stop now, not after a CPU fallback
    wc = snakemake.wildcards
    names = list(snakemake.params.benchmarks)
    seeds = {s: (seed, [generation_path(wc.model, wc.checkpoint, b, s) for b in names])
             for s, seed in snakemake.params.seeds.items()}
    assert sorted(p for _, outs in seeds.values() for p in outs) == sorted(snakemake.output.generations)
    # One copy of the job at a time (its kept shards); a notice signal: the shard in progress is saved, then exit 75.
    with exit_on_notice(console=True), one_writer(snakemake.output.generations[0], f"generate {wc.model}/{wc.checkpoint}"):
        run_generations(
            benchmarks=[(name, read_parquet(table)) for name, table in zip(names, snakemake.input.benchmarks)],
            seeds=seeds,
            manifest=read_manifest(snakemake.input.model),
            settings=snakemake.params.sampling,
            chat_template=snakemake.params.chat_template,
            dtype=snakemake.params.dtype,
            backend_name=snakemake.params.backend,
            backend_options=execution_settings(snakemake.config, wc.model)["backend_options"],
            metadata={"model": wc.model, "checkpoint": wc.checkpoint, "versions": versions()},
        )


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("generate"))  # noqa: F821
