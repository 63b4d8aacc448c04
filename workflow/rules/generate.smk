# Sampling a checkpoint with one evaluation seed on every benchmark (evaluation protocol of the
# paper: n=12, T=1.0, top_p=0.95, top_k off, 38,912 new tokens, enable_thinking=True). One job
# per (model, checkpoint, seed) loads the model (or starts the vLLM engine) once for all
# benchmarks; each benchmark's parquet is written as soon as it is done.
#
# params hold exactly what determines the samples, so changing any of them re-runs the job;
# execution knobs that do not change a sample (hf batch size, vLLM memory fraction, TP/DP layout)
# are read from the config by the script and do not. With evaluation.seeds_per_job: all (tiny
# mode) one job samples every seed of a checkpoint (GENERATION_SEED is then no wildcard); the
# files are the same.


rule generate:
    input:
        benchmarks=expand("results/data/benchmarks/{benchmark}.parquet", benchmark=BENCHMARKS),
        model=model_manifest,
    output:
        generations=expand(generation_path("{{model}}", "{{checkpoint}}", "{benchmark}", "{seed}"),
                           benchmark=BENCHMARKS, seed=GENERATION_SEEDS),
    params:
        sampling=config_param(settings.sampling),
        seeds=config_param(settings.generation_seeds),
        chat_template=config_param(settings.chat_template),
        dtype=config_param(settings.dtype),
        backend=config_param(settings.backend),
        benchmarks=config_param(settings.benchmarks),
    threads: config_param(settings.generation_threads)
    resources:
        gpu=config_param(settings.gpus, "generate"),
    priority: config_param(settings.chain_priority, 1)
    log:
        f"logs/generate/{{model}}/{{checkpoint}}/seed-{GENERATION_SEED_NAME}.log",
    benchmark:
        f"logs/benchmarks/generate/{{model}}/{{checkpoint}}/seed-{GENERATION_SEED_NAME}.tsv"
    conda:
        "../../envs/vllm.yaml"
    script:
        "../scripts/generate.py"


if SWEEP_JOBS_OF_THEIR_OWN:

    # A swept step's checkpoint (<run>-step<N>) with only evaluation.sweep_seeds (a cheaper sweep).
    use rule generate as generate_sweep_step with:
        output:
            generations=expand(generation_path("{{model}}", "{{checkpoint}}", "{benchmark}", "{seed}"),
                               benchmark=BENCHMARKS, seed=SWEEP_SEEDS),
        wildcard_constraints:
            checkpoint=SWEEP_CHECKPOINT,

    ruleorder: generate_sweep_step > generate
