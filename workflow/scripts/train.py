"""Rule train: one model x method training run (torchrun processes when several GPUs are given)."""

from pathlib import Path

from pwopsd.runtime import set_threads, setup_logging
from pwopsd.sampling import fingerprint
from pwopsd.standalone import standalone_snakemake
from pwopsd.train_job import launch


def main(snakemake):
    setup_logging(snakemake.log[0])
    set_threads(snakemake.threads)
    p = snakemake.params
    # Checkpoints of a run live under a directory keyed by its settings: a changed setting never
    # resumes from a stale checkpoint.
    work_dir = Path(p.work_root) / fingerprint({"train": p.train, "model": snakemake.input.model})
    args = {
        "manifest": snakemake.input.model,
        "corpus": snakemake.input.corpus,
        "train": p.train,
        "dtype": p.dtype,
        "chat_template": p.chat_template,
        "work_dir": str(work_dir),
        "eval_step": p.eval_step,
        "adapter_out": snakemake.output.adapter,
        "log_out": snakemake.output.log,
    }
    launch(args, processes=int(snakemake.resources.get("gpu", 0) or 0), args_path=work_dir.parent / "launch_args.json",
           log_path=snakemake.log[0])


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("train"))  # noqa: F821
