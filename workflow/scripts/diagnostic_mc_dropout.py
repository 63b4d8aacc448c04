"""Rule mc_dropout (diagnostic Phase D): H_full, MI and Dirichlet precision at every candidate."""

from pwopsd.accelerator import require_job_cuda
from pwopsd.diagnostic.phases import run_mc_dropout
from pwopsd.io import read_parquet, write_parquet
from pwopsd.models import load_checkpoint
from pwopsd.runtime import provenance, set_threads, setup_logging
from pwopsd.standalone import standalone_snakemake


def main(snakemake):
    log = setup_logging(snakemake.log[0])
    set_threads(snakemake.threads)
    require_job_cuda(snakemake)  # asked for GPUs and found none: stop now, not after a CPU fallback
    s = snakemake.params.settings
    manifest, model, tokenizer = load_checkpoint(snakemake.input.model, s["dtype"])
    table = run_mc_dropout(model, tokenizer, read_parquet(snakemake.input.spines),
                           read_parquet(snakemake.input.candidates), s)
    write_parquet(table, snakemake.output.mc_dropout, metadata=provenance(manifest, phase="D", settings=s))
    log.info("MC dropout: %d candidates", len(table))


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("mc_dropout"))  # noqa: F821
