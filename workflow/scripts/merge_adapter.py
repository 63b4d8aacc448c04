"""Rules merge_adapter and merge_step_adapter: merge the evaluation-step adapter (or a swept
step's) into a standalone checkpoint (on CPU)."""

from pwopsd.io import write_json
from pwopsd.keys import folder_content_sha256
from pwopsd.models import read_manifest
from pwopsd.runtime import set_threads, setup_logging, versions
from pwopsd.standalone import standalone_snakemake
from pwopsd.training.merge import merge_lora_checkpoint


def main(snakemake):
    log = setup_logging(snakemake.log[0])
    set_threads(snakemake.threads)  # and cpu_matmul: the merge's products are matrix products too
    base = read_manifest(snakemake.input.model)
    merge_lora_checkpoint(base["path"], snakemake.input.adapter, snakemake.output.merged, snakemake.params.dtype)
    wc = snakemake.wildcards
    step = snakemake.params.get("step", snakemake.params.eval_step)  # a swept step's checkpoint (merge_step_adapter)
    # The merged weights' content hash: what every job that reuses work made with them keys on
    # (pwopsd.keys.weights_identity); retraining writes new weights to the same path.
    write_json({"model": wc.model, "kind": "merged", "method": wc.method, "step": step,
                "path": snakemake.output.merged, "content_sha256": folder_content_sha256(snakemake.output.merged),
                "base": base, "adapter": snakemake.input.adapter, "versions": versions()}, snakemake.output.manifest)
    log.info("merged %s into %s", snakemake.input.adapter, snakemake.output.merged)


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("merge_adapter"))  # noqa: F821
