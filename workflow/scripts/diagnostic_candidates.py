"""Rule candidates (diagnostic Phase C): filtered high-truncated-entropy positions and their children."""

from pwopsd.diagnostic.phases import run_candidates
from pwopsd.io import read_parquet, write_parquet
from pwopsd.models import load_tokenizer, read_manifest
from pwopsd.runtime import provenance, setup_logging
from pwopsd.standalone import standalone_snakemake


def main(snakemake):
    log = setup_logging(snakemake.log[0])
    s = snakemake.params.settings
    manifest = read_manifest(snakemake.input.model)
    cands = run_candidates(load_tokenizer(manifest), read_parquet(snakemake.input.spines),
                           read_parquet(snakemake.input.teacher_pass), s)
    write_parquet(cands, snakemake.output.candidates, metadata=provenance(manifest, phase="C", settings=s))
    log.info("candidates: %d over %d problems", len(cands), cands[["dataset", "problem_id"]].drop_duplicates().shape[0])


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("candidates"))  # noqa: F821
