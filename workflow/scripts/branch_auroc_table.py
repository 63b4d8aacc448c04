"""Rule branch_auroc_table: Table 1 (+ its numbers as CSV) from the Phase G summary."""

import pandas as pd

from pwopsd.io import atomic_path, read_json
from pwopsd.runtime import setup_logging, write_job_provenance
from pwopsd.standalone import standalone_snakemake
from pwopsd.report.tables import branch_auroc_table


def main(snakemake):
    log = setup_logging(snakemake.log[0])
    summary = read_json(snakemake.input.summary)
    with atomic_path(snakemake.output.tex) as tmp:
        tmp.write_text(branch_auroc_table(summary, model_label=snakemake.params.model_label))
    with atomic_path(snakemake.output.csv) as tmp:
        pd.DataFrame(summary["scores"]).to_csv(tmp, index=False, float_format="%.6f")
    log.info("Table 1: %s", summary["status"])
    write_job_provenance(snakemake, snakemake.output.provenance)


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("branch_auroc_table"))  # noqa: F821
