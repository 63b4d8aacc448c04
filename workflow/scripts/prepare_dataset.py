"""Rule prepare_benchmark / prepare_train_corpus: normalize one dataset entry to parquet."""

from pwopsd.data import prepare_dataset
from pwopsd.io import write_json, write_parquet
from pwopsd.runtime import setup_logging, versions
from pwopsd.settings import execution_settings
from pwopsd.standalone import standalone_snakemake


def main(snakemake):
    log = setup_logging(snakemake.log[0])
    name = snakemake.wildcards.get("benchmark")
    key = f"benchmarks.{name}" if name else "train_corpus"
    if snakemake.params.entry is None:
        raise SystemExit(f"{key}: not configured")
    df, manifest = prepare_dataset(snakemake.params.entry, key, hub=execution_settings(snakemake.config)["hub"])
    manifest["versions"] = versions()
    write_parquet(df, snakemake.output.table, metadata=manifest)
    write_json(manifest, snakemake.output.manifest)
    log.info("%s: %d rows -> %s", key, len(df), snakemake.output.table)


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("prepare_benchmark"))  # noqa: F821
