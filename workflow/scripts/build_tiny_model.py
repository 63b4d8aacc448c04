"""Rule build_tiny_model: build, pretrain and check the tiny Qwen3 model."""

from pwopsd.runtime import set_threads, setup_logging
from pwopsd.tiny.build import build_tiny_model
from pwopsd.standalone import standalone_snakemake


def main(snakemake):
    setup_logging(snakemake.log[0])
    set_threads(snakemake.threads)
    build_tiny_model(
        name=snakemake.wildcards.model,
        settings=snakemake.params.tiny,
        model_dir=snakemake.output.model,
        manifest_path=snakemake.output.manifest,
        report_path=snakemake.output.report,
    )


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("build_tiny_model"))  # noqa: F821
