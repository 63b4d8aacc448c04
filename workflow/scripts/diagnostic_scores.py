"""Rule branch_scores (diagnostic Phase G): residualized AUROC / AUPRC with cluster-bootstrap CIs."""

from pwopsd.diagnostic.scores import branch_auroc_summary, scored_candidates
from pwopsd.io import read_parquet, write_json, write_parquet
from pwopsd.runtime import provenance, setup_logging
from pwopsd.standalone import standalone_snakemake
from pwopsd.tracking import diagnostic_run, track_once


def main(snakemake):
    log = setup_logging(snakemake.log[0])
    spines = read_parquet(snakemake.input.spines)
    scored = scored_candidates(spines, read_parquet(snakemake.input.candidates),
                               read_parquet(snakemake.input.mc_dropout), read_parquet(snakemake.input.labels))
    summary = branch_auroc_summary(scored, spines, snakemake.params.settings)
    summary["provenance"] = provenance(phase="G", model=snakemake.wildcards.model)
    write_parquet(scored, snakemake.output.scored, metadata=provenance(phase="G", settings=snakemake.params.settings))
    write_json(summary, snakemake.output.summary)
    log.info("%s; counts %s", summary["status"], summary["counts"])
    # Experiment tracking (config, not params: it reruns no job); a tracker failure is one warning.
    track_once(snakemake.config.get("tracking"), *diagnostic_run(snakemake.wildcards.model, summary))


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("branch_scores"))  # noqa: F821
