# Grading and metrics: generations -> graded samples + per-seed metrics -> aggregate over seeds
# (mean ± Bessel sample std, and the equal-weight mean over benchmarks from unrounded seed values).


rule grade:
    # One job per checkpoint and seed, or per checkpoint for every seed (evaluation.seeds_per_job,
    # as rule generate): grading starts one worker pool per job.
    input:
        generations=expand(generation_path("{{model}}", "{{checkpoint}}", "{benchmark}", "{seed}"),
                           benchmark=BENCHMARKS, seed=GENERATION_SEEDS),
        benchmarks=expand("results/data/benchmarks/{benchmark}.parquet", benchmark=BENCHMARKS),
    output:
        graded=expand("results/graded/{{model}}/{{checkpoint}}/{benchmark}/seed-{seed}.parquet",
                      benchmark=BENCHMARKS, seed=GENERATION_SEEDS),
        metrics=expand("results/metrics/{{model}}/{{checkpoint}}/{benchmark}/seed-{seed}.json",
                       benchmark=BENCHMARKS, seed=GENERATION_SEEDS),
    params:
        grading=config_param(settings.grading),
        benchmarks=config_param(settings.benchmarks),
        seeds=config_param(settings.job_seeds),
    threads: config_param(settings.grading_workers)
    priority: config_param(settings.chain_priority, 0)
    log:
        f"logs/grade/{{model}}/{{checkpoint}}/seed-{GENERATION_SEED_NAME}.log",
    benchmark:
        f"logs/benchmarks/grade/{{model}}/{{checkpoint}}/seed-{GENERATION_SEED_NAME}.tsv"
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/grade.py"


rule aggregate_metrics:
    input:
        metrics=all_seed_metrics,
    output:
        per_seed="results/metrics/per_seed.csv",
        summary="results/metrics/summary.csv",
        summary_parquet="results/metrics/summary.parquet",
        provenance="results/metrics/summary.provenance.json",
    params:
        benchmarks=config_param(settings.benchmarks),
    log:
        "logs/aggregate_metrics.log",
    benchmark:
        "logs/benchmarks/aggregate_metrics.tsv"
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/aggregate_metrics.py"


if SWEEP_JOBS_OF_THEIR_OWN:

    # A swept step's checkpoint with only evaluation.sweep_seeds (see generate_sweep_step).
    use rule grade as grade_sweep_step with:
        input:
            generations=expand(generation_path("{{model}}", "{{checkpoint}}", "{benchmark}", "{seed}"),
                               benchmark=BENCHMARKS, seed=SWEEP_SEEDS),
            benchmarks=expand("results/data/benchmarks/{benchmark}.parquet", benchmark=BENCHMARKS),
        output:
            graded=expand("results/graded/{{model}}/{{checkpoint}}/{benchmark}/seed-{seed}.parquet",
                          benchmark=BENCHMARKS, seed=SWEEP_SEEDS),
            metrics=expand("results/metrics/{{model}}/{{checkpoint}}/{benchmark}/seed-{seed}.json",
                           benchmark=BENCHMARKS, seed=SWEEP_SEEDS),
        wildcard_constraints:
            checkpoint=SWEEP_CHECKPOINT,

    ruleorder: grade_sweep_step > grade
