"""Rule teacher_pass (diagnostic Phase B): teacher-template distributions along every spine."""

from pwopsd.accelerator import require_job_cuda
from pwopsd.diagnostic.phases import run_teacher_pass
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
    table = run_teacher_pass(model, tokenizer, read_parquet(snakemake.input.spines), s)
    write_parquet(table, snakemake.output.teacher_pass, metadata=provenance(manifest, phase="B", settings=s))
    log.info("teacher pass: %d spine positions", len(table))


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("teacher_pass"))  # noqa: F821
