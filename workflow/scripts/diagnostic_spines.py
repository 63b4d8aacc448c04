"""Rule spines (diagnostic Phase A): greedy student-template rollouts with a T=0.7 fallback, graded."""

from pwopsd.accelerator import require_job_cuda
from pwopsd.diagnostic.phases import run_spines, sample_problems
from pwopsd.evaluation.grading import answer_grader
from pwopsd.generation.sampling import generation_identity, make_backend
from pwopsd.io import clear_partial, one_writer, partial_dir, read_parquet, write_parquet
from pwopsd.models import load_tokenizer, read_manifest
from pwopsd.runtime import provenance, set_threads, setup_logging
from pwopsd.settings import execution_settings
from pwopsd.standalone import standalone_snakemake
from pwopsd.notice import Notice, exit_on_notice


def main(snakemake):
    log = setup_logging(snakemake.log[0])
    set_threads(snakemake.threads)
    require_job_cuda(snakemake)  # asked for GPUs and found none: stop now, not after a CPU fallback
    s, out = snakemake.params.settings, snakemake.output.spines
    manifest = read_manifest(snakemake.input.model)
    tokenizer = load_tokenizer(manifest)
    tables = {name: read_parquet(path) for name, path in zip(snakemake.params.datasets, snakemake.input.benchmarks)}
    problems = sample_problems(tables, dict(s["datasets"]), int(s["sample_seed"]))
    grade = answer_grader(snakemake.params.grading, snakemake.threads)
    options = execution_settings(snakemake.config, snakemake.wildcards.model)["backend_options"]
    # Kept shards are the work of these weights (by content), dtype, backend, engine and code; run_spines adds the requests.
    identity = generation_identity(manifest, dtype=s["dtype"], backend_name=snakemake.params.backend, backend_options=options,
                                   code="pwopsd.diagnostic.phases", max_model_len=s["spine"]["max_model_len"])
    # On a notice signal the shard in progress is saved and the job exits 75 (resumable) before the next.
    with exit_on_notice(console=True), one_writer(out, f"spines {snakemake.wildcards.model}"), Notice() as notice, \
            make_backend(snakemake.params.backend, manifest, dtype=s["dtype"], max_model_len=s["spine"]["max_model_len"],
                         options=options, tokenizer=tokenizer) as backend:
        spines = run_spines(backend, tokenizer, problems, s, grade=grade, notice=notice,
                            partial_root=lambda key, part: partial_dir(out, {**identity, "part": key}, part))
    write_parquet(spines, out, metadata=provenance(manifest, phase="A", settings=s, grading=snakemake.params.grading,
                                                   backend=backend.versions()))
    clear_partial(out)
    log.info("spines: %d problems, %d correct, %d by fallback", len(spines), int(spines["correct"].sum()),
             int((spines["decoding"] == "fallback").sum()))


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("spines"))  # noqa: F821
