# Grading and metrics: generations -> graded samples + per-seed metrics -> aggregate over seeds
# (mean ± Bessel sample std, and the equal-weight mean over benchmarks from unrounded seed values).


rule grade:
    input:
        generations="results/generations/{model}/{checkpoint}/{benchmark}/seed-{seed}.parquet",
        benchmark="results/data/benchmarks/{benchmark}.parquet",
    output:
        graded="results/graded/{model}/{checkpoint}/{benchmark}/seed-{seed}.parquet",
        metrics="results/metrics/{model}/{checkpoint}/{benchmark}/seed-{seed}.json",
    params:
        grading=lambda wc: cfgmod.grading_options(config),
    threads: lambda wc: config["grading"]["workers"]
    log:
        "logs/grade/{model}/{checkpoint}/{benchmark}/seed-{seed}.log",
    benchmark:
        "logs/benchmarks/grade/{model}/{checkpoint}/{benchmark}/seed-{seed}.tsv"
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
    params:
        benchmarks=BENCHMARKS,
    log:
        "logs/aggregate_metrics.log",
    benchmark:
        "logs/benchmarks/aggregate_metrics.tsv"
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/aggregate_metrics.py"
