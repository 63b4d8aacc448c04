"""Rule branch_auroc_figure: Figure 1 (failure rate by position vs entropy; reliability curve with
the PW-OPSD schedule) and the scatter/histogram figure, each with its plotted data as CSV."""

from pwopsd.diagnostic.scores import diagnostic_pool
from pwopsd.io import read_json, read_parquet
from pwopsd.report.figures import branch_auroc_figure, branch_scatter_figure
from pwopsd.runtime import setup_logging, write_job_provenance
from pwopsd.standalone import standalone_snakemake


def main(snakemake):
    log = setup_logging(snakemake.log[0])
    settings = snakemake.params.settings
    scored = diagnostic_pool(read_parquet(snakemake.input.scored), settings["scores"])
    fig = dict(settings["figure"])
    data = branch_auroc_figure(scored, bins=int(fig["bins"]), schedule=fig["schedule_params"], schedule_name=fig["schedule"],
                               schedule_label=fig["schedule_label"],
                               pdf_path=snakemake.output.pdf, csv_path=snakemake.output.csv,
                               fitted=read_json(snakemake.input.fitted))
    branch_scatter_figure(scored, labels=settings["labels"], pdf_path=snakemake.output.scatter_pdf,
                          csv_path=snakemake.output.scatter_csv)
    log.info("Figure 1 from %d candidates (%d plotted bins)", len(scored), len(data))
    write_job_provenance(snakemake, snakemake.output.provenance)


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("branch_auroc_figure"))  # noqa: F821
