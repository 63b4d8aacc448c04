"""Rule training_curves: per-step curves of every training run of one model."""

from pwopsd.report.figures import training_curves
from pwopsd.runtime import setup_logging, write_job_provenance
from pwopsd.standalone import standalone_snakemake


def main(snakemake):
    setup_logging(snakemake.log[0])
    training_curves(dict(zip(snakemake.params.runs, snakemake.input.logs)), snakemake.output.pdf, snakemake.output.csv)
    write_job_provenance(snakemake, snakemake.output.provenance)


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("training_curves"))  # noqa: F821
