"""Rule grade: grade one checkpoint's generations for one seed (or every seed, per
``evaluation.seeds_per_job``) on every benchmark; write graded samples and per-seed metrics.
Resumable one benchmark-seed pair at a time; on a notice signal it exits 75 between two pairs."""

from pwopsd.evaluation.grading import GraderPool, pool_settings
from pwopsd.evaluation.pipeline import grade_checkpoint
from pwopsd.io import one_writer
from pwopsd.runtime import setup_logging, versions
from pwopsd.standalone import standalone_snakemake
from pwopsd.tracking import evaluation_run, track_once
from pwopsd.notice import Notice, exit_on_notice


def main(snakemake):
    setup_logging(snakemake.log[0])
    gs = pool_settings(snakemake.params.grading)
    wc = snakemake.wildcards
    # inputs and outputs are expanded benchmark-major over the job's seeds (see rule grade)
    names = [(name, seed) for name in snakemake.params.benchmarks for seed in snakemake.params.seeds]
    pairs = [(name, seed, gens, graded_out, metrics_out) for (name, seed), gens, graded_out, metrics_out
             in zip(names, snakemake.input.generations, snakemake.output.graded, snakemake.output.metrics, strict=True)]
    for name, seed, _, graded_out, metrics_out in pairs:
        assert graded_out.endswith(f"/{name}/seed-{seed}.parquet") and metrics_out.endswith(f"/{name}/seed-{seed}.json")
    meta = {"model": wc.model, "checkpoint": wc.checkpoint, "grading_options": snakemake.params.grading, "versions": versions()}
    with exit_on_notice(console=True), one_writer(snakemake.output.graded[0], f"grade {wc.model}/{wc.checkpoint}"), \
            Notice() as notice, \
            GraderPool(workers=snakemake.threads, timeout=gs.timeout, options=gs.options, progress=True) as pool:
        summaries = grade_checkpoint(pairs, dict(zip(snakemake.params.benchmarks, snakemake.input.benchmarks)), pool=pool,
                                     meta=meta, maj_budget=gs.maj_budget, graders=gs.graders, verdicts=gs.verdicts,
                                     notice=notice)
    # Experiment tracking (config, not params: it reruns no job); a tracker failure is one warning.
    track_once(snakemake.config.get("tracking"), *evaluation_run(wc.model, wc.checkpoint, summaries, snakemake.params.grading))


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("grade"))  # noqa: F821
