"""Rule fetch_model: resolve a Hub model at its pinned revision and record its manifest."""

from pwopsd.io import write_json
from pwopsd.models import resolve_hub_model
from pwopsd.runtime import setup_logging, versions
from pwopsd.standalone import standalone_snakemake


def main(snakemake):
    log = setup_logging(snakemake.log[0])
    manifest = resolve_hub_model(
        snakemake.wildcards.model,
        hf_id=snakemake.params.hf_id,
        revision=snakemake.params.revision,
        hub=snakemake.config.get("hub", {}),
    )
    manifest["versions"] = versions()
    write_json(manifest, snakemake.output.manifest)
    log.info("%s@%s -> %s", snakemake.params.hf_id, snakemake.params.revision, manifest["path"])


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("fetch_model"))  # noqa: F821
