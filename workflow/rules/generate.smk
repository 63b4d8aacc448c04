# Sampling a checkpoint on a benchmark with one evaluation seed (evaluation protocol of the
# paper: n=12, T=1.0, top_p=0.95, top_k off, 38,912 new tokens, enable_thinking=True).


rule generate:
    input:
        benchmark="results/data/benchmarks/{benchmark}.parquet",
        model=model_manifest,
    output:
        generations="results/generations/{model}/{checkpoint}/{benchmark}/seed-{seed}.parquet",
    params:
        model_entry=model_entry,
        evaluation=config["evaluation"],
        seed=lambda wc: cfgmod.sampling_seed(config, wc.seed),
        backend=generation_backend,
    threads: 2
    resources:
        gpu=gpus_for("generate"),
    log:
        "logs/generate/{model}/{checkpoint}/{benchmark}/seed-{seed}.log",
    benchmark:
        "benchmarks/generate/{model}/{checkpoint}/{benchmark}/seed-{seed}.tsv"
    conda:
        "../../envs/vllm.yaml"
    script:
        "../scripts/generate.py"
