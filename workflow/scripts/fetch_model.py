"""Rule fetch_model: resolve a Hub model at its pinned revision and record its manifest."""

from pwopsd.io import write_json
from pwopsd.models import resolve_hub_model
from pwopsd.runtime import setup_logging, versions


def main(snakemake):
    log = setup_logging(snakemake.log[0])
    manifest = resolve_hub_model(snakemake.wildcards.model, snakemake.params.entry, snakemake.params.hub)
    manifest["versions"] = versions()
    write_json(manifest, snakemake.output.manifest)
    log.info("%s -> %s", snakemake.params.entry["hf_id"], manifest["path"])


if __name__ == "__main__":
    main(snakemake)  # noqa: F821
