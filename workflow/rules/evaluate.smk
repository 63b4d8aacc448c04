# Grading and metrics: generations -> graded samples + per-seed metrics -> aggregate over seeds
# (mean ± Bessel sample std, and the equal-weight mean over benchmarks from unrounded seed values).


rule grade:
    input:
        generations=expand(generation_path("{{model}}", "{{checkpoint}}", "{benchmark}", "{{seed}}"),
                           benchmark=BENCHMARKS),
        benchmarks=expand("results/data/benchmarks/{benchmark}.parquet", benchmark=BENCHMARKS),
    output:
        graded=expand(
            "results/graded/{{model}}/{{checkpoint}}/{benchmark}/seed-{{seed}}.parquet",
            benchmark=BENCHMARKS,
        ),
        metrics=expand(
            "results/metrics/{{model}}/{{checkpoint}}/{benchmark}/seed-{{seed}}.json",
            benchmark=BENCHMARKS,
        ),
    params:
        grading=config_param(settings.grading),
        benchmarks=config_param(settings.benchmarks),
    threads: config_param(settings.grading_workers)
    log:
        "logs/grade/{model}/{checkpoint}/seed-{seed}.log",
    benchmark:
        "logs/benchmarks/grade/{model}/{checkpoint}/seed-{seed}.tsv"
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
