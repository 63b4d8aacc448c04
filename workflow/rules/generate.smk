# Sampling a checkpoint on a benchmark with one evaluation seed (evaluation protocol of the
# paper: n=12, T=1.0, top_p=0.95, top_k off, 38,912 new tokens, enable_thinking=True).
#
# params hold exactly what determines the samples, so changing any of them re-runs the job;
# execution knobs that do not change a sample (hf batch size, vLLM memory fraction, TP/DP layout)
# are read from the config by the script and do not.


rule generate:
    input:
        benchmark="results/data/benchmarks/{benchmark}.parquet",
        model=model_manifest,
    output:
        generations="results/generations/{model}/{checkpoint}/{benchmark}/seed-{seed}.parquet",
    params:
        sampling=eval_sampling_settings,
        seed=lambda wc: cfgmod.sampling_seed(config, wc.seed),
        chat_template=lambda wc: config["models"][wc.model]["chat_template"],
        dtype=lambda wc: config["models"][wc.model]["dtype"],
        backend=generation_backend,
    threads: 2
    resources:
        gpu=gpus_for("generate"),
    log:
        "logs/generate/{model}/{checkpoint}/{benchmark}/seed-{seed}.log",
    benchmark:
        "logs/benchmarks/generate/{model}/{checkpoint}/{benchmark}/seed-{seed}.tsv"
    conda:
        "../../envs/vllm.yaml"
    script:
        "../scripts/generate.py"
