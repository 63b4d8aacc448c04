# Base checkpoints. Hub models are resolved at their pinned revision into the HF cache and
# recorded in a manifest; tiny models are built and pretrained by the workflow.


rule fetch_model:
    output:
        manifest="results/models/{model}/base.json",
    wildcard_constraints:
        model=_alternatives(HUB_MODELS),
    params:
        hub_model=config_param(settings.hub_model),
    log:
        "logs/models/fetch_model/{model}.log",
    benchmark:
        "logs/benchmarks/models/fetch_model/{model}.tsv"
    conda:
        "../../envs/train.yaml"
    script:
        "../scripts/fetch_model.py"


rule build_tiny_model:
    output:
        model=directory("results/models/{model}/base"),
        manifest="results/models/{model}/base.json",
        report="results/models/{model}/build_report.json",
    wildcard_constraints:
        model=_alternatives(BUILT_MODELS),
    params:
        tiny=config_param(settings.tiny_model),
        kernel_path=KERNEL_PATH,  # the CPU kernel path in force (cpu_kernel_path): another path, another model
        cpu_matmul=CPU_MATMUL,  # how matrix products are computed (cpu_matmul): another way, another model
    threads: config_param(settings.tiny_threads)
    log:
        "logs/models/build_tiny_model/{model}.log",
    benchmark:
        "logs/benchmarks/models/build_tiny_model/{model}.tsv"
    conda:
        "../../envs/train.yaml"
    script:
        "../scripts/build_tiny_model.py"
