"""Rule schedules_figure: Figure 2, the PW-OPSD weight schedules (and their data as CSV)."""

from pwopsd.report.figures import schedules_figure
from pwopsd.runtime import setup_logging, write_job_provenance
from pwopsd.standalone import standalone_snakemake


def main(snakemake):
    setup_logging(snakemake.log[0])
    schedules = {name: tuple(s["params"]) for name, s in snakemake.params.schedules.items()}
    titles = {name: s["label"] for name, s in snakemake.params.schedules.items()}
    schedules_figure(schedules, snakemake.output.pdf, snakemake.output.csv, titles=titles)
    write_job_provenance(snakemake, snakemake.output.provenance)


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("schedules_figure"))  # noqa: F821
