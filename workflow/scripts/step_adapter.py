"""Rule step_adapter: the adapter a finished run saved at a swept step (beyond the paper), from
the run's checkpoint folder, without training again."""

from pwopsd.runtime import setup_logging
from pwopsd.standalone import standalone_snakemake
from pwopsd.training.job import export_step


def main(snakemake):
    log = setup_logging(snakemake.log[0])
    source = export_step(snakemake.params.checkpoints, snakemake.input.adapter, snakemake.params.eval_step,
                         int(snakemake.wildcards.step), snakemake.output.adapter)
    log.info("adapter of step %s from %s", snakemake.wildcards.step, source)


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("step_adapter"))  # noqa: F821
