"""Rule grade: grade one checkpoint's generations for one seed (or every seed, per
``evaluation.seeds_per_job``) on every benchmark; write graded samples and per-seed metrics."""

from pwopsd.evaluation.pipeline import grade_run
from pwopsd.evaluation.grading import GraderPool, pool_settings
from pwopsd.io import read_parquet, write_json, write_parquet
from pwopsd.runtime import setup_logging, versions
from pwopsd.standalone import standalone_snakemake
from pwopsd.tracking import evaluation_run, track_once


def main(snakemake):
    log = setup_logging(snakemake.log[0])
    gs = pool_settings(snakemake.params.grading)
    wc = snakemake.wildcards
    tables = dict(zip(snakemake.params.benchmarks, snakemake.input.benchmarks))
    # inputs and outputs are expanded benchmark-major over the job's seeds (see rule grade)
    jobs = [(name, seed) for name in snakemake.params.benchmarks for seed in snakemake.params.seeds]
    summaries = []
    with GraderPool(workers=snakemake.threads, timeout=gs.timeout, options=gs.options, progress=True) as pool:
        for (name, seed), gens, graded_out, metrics_out in zip(jobs, snakemake.input.generations, snakemake.output.graded,
                                                               snakemake.output.metrics, strict=True):
            assert graded_out.endswith(f"/{name}/seed-{seed}.parquet") and metrics_out.endswith(f"/{name}/seed-{seed}.json")
            meta = {"model": wc.model, "checkpoint": wc.checkpoint, "benchmark": name, "seed_name": seed,
                    "grading_options": snakemake.params.grading, "versions": versions()}
            graded, summary = grade_run(read_parquet(gens), read_parquet(tables[name]), pool=pool, meta=meta,
                                        maj_budget=gs.maj_budget, graders=gs.graders, verdicts=gs.verdicts)
            write_parquet(graded, graded_out, metadata=meta)
            write_json(summary, metrics_out)
            summaries.append(summary)
            log.info("%s: %s", metrics_out, summary["metrics_pct"])
    # Experiment tracking (config, not params: it reruns no job); a tracker failure is one warning.
    track_once(snakemake.config.get("tracking"), *evaluation_run(wc.model, wc.checkpoint, summaries, snakemake.params.grading))


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("grade"))  # noqa: F821
