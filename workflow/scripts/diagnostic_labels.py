"""Rule viability_labels (diagnostic Phase F): child viabilities and candidate labels."""

from pwopsd.diagnostic.phases import label_candidates
from pwopsd.evaluation.grading import answer_grader
from pwopsd.io import read_parquet, write_parquet
from pwopsd.runtime import provenance, setup_logging
from pwopsd.standalone import standalone_snakemake


def main(snakemake):
    log = setup_logging(snakemake.log[0])
    grade = answer_grader(snakemake.params.grading, snakemake.threads)

    labels = label_candidates(read_parquet(snakemake.input.candidates), read_parquet(snakemake.input.continuations),
                              read_parquet(snakemake.input.spines), snakemake.params.settings, grade=grade)
    write_parquet(labels, snakemake.output.labels, metadata=provenance(phase="F", settings=snakemake.params.settings,
                                                                       grading=snakemake.params.grading))
    log.info("labels: %s", labels["label"].value_counts().to_dict())


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("viability_labels"))  # noqa: F821
