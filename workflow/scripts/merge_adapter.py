"""Rule merge_adapter: merge the evaluation-step adapter into a standalone checkpoint (on CPU)."""

from pwopsd.io import write_json
from pwopsd.models import load_model, load_tokenizer, read_manifest
from pwopsd.runtime import setup_logging, versions
from pwopsd.standalone import standalone_snakemake
from pwopsd.training.loop import merge_adapter


def main(snakemake):
    log = setup_logging(snakemake.log[0])
    base = read_manifest(snakemake.input.model)
    model = load_model(base, device="cpu", dtype=snakemake.params.dtype)
    merge_adapter(model, load_tokenizer(base), snakemake.input.adapter, snakemake.output.merged)
    wc = snakemake.wildcards
    write_json({"model": wc.model, "kind": "merged", "method": wc.method, "step": snakemake.params.eval_step,
                "path": snakemake.output.merged, "base": base, "adapter": snakemake.input.adapter,
                "versions": versions()}, snakemake.output.manifest)
    log.info("merged %s into %s", snakemake.input.adapter, snakemake.output.merged)


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("merge_adapter"))  # noqa: F821
