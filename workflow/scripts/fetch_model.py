"""Rule fetch_model: resolve a Hub model at its pinned revision and record its manifest."""

from pwopsd.io import write_json
from pwopsd.models import resolve_hub_model
from pwopsd.runtime import setup_logging, versions
from pwopsd.settings import execution_settings
from pwopsd.standalone import standalone_snakemake


def main(snakemake):
    log = setup_logging(snakemake.log[0])
    manifest = resolve_hub_model(
        snakemake.wildcards.model,
        hf_id=snakemake.params.hub_model["hf_id"],
        revision=snakemake.params.hub_model["revision"],
        hub=execution_settings(snakemake.config)["hub"],
    )
    manifest["versions"] = versions()
    write_json(manifest, snakemake.output.manifest)
    log.info("%s@%s -> %s", manifest.get("hf_id"), manifest.get("revision"), manifest["path"])


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("fetch_model"))  # noqa: F821
