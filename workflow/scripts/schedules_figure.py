"""Rule schedules_figure: Figure 2, the PW-OPSD weight schedules (and their data as CSV)."""

from pwopsd.io import read_json
from pwopsd.report.figures import schedules_figure
from pwopsd.runtime import setup_logging, write_job_provenance
from pwopsd.standalone import standalone_snakemake


def main(snakemake):
    setup_logging(snakemake.log[0])
    fit = read_json(snakemake.input.fitted) if "fitted" in snakemake.input.keys() else None
    schedules, fitted = {}, {}
    for name, spec in snakemake.params.schedules.items():
        if spec["params"] is None:  # schedule_from: diagnostic
            schedules[name], fitted[name] = tuple(fit["params"][k] for k in ("w_min", "tau", "s")), fit
        else:
            schedules[name] = tuple(spec["params"])
    titles = {name: s["label"] for name, s in snakemake.params.schedules.items()}
    schedules_figure(schedules, snakemake.output.pdf, snakemake.output.csv, titles=titles, fitted=fitted)
    write_job_provenance(snakemake, snakemake.output.provenance)


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("schedules_figure"))  # noqa: F821
