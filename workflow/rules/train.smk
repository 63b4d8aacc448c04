# Training (one job per model x method), merging the evaluation-step adapter into a standalone
# checkpoint, and the training curves. Checkpoints every `training.save_every` steps go to a
# working directory (not a declared output) keyed by everything that determines the run: settings,
# base model content or pinned revision, corpus content, prompt switches, dtype, library versions
# and training code (pwopsd.training.job.run_key). A killed or preempted job resumes from its last
# checkpoint; a changed input restarts from step 0.


rule train:
    input:
        unpack(train_inputs),
    output:
        adapter=directory("results/training/{model}/{method}/adapter"),
        log="results/training/{model}/{method}/train_log.jsonl",
    params:
        train=config_param(settings.training_run),
        processes=config_param(settings.training_processes),
        eval_step=config_param(settings.eval_step),
        dtype=config_param(settings.dtype),
        chat_template=config_param(settings.chat_template),
        work_root=config_param(settings.checkpoint_root),
    threads: config_param(settings.training_threads)
    resources:
        # Seconds of the profile's time-limit warning (--signal=TERM@N): torchrun waits that long for
        # the ranks' checkpoint after passing the warning on. A resource, not a param: changing it
        # reruns no training.
        notice_window_s=TRAIN_NOTICE_SECONDS,
        gpu=config_param(settings.gpus, "train"),
    priority: config_param(settings.chain_priority, 3)
    retries: TRAIN_RETRIES
    log:
        "logs/train/{model}/{method}.log",
    benchmark:
        "logs/benchmarks/train/{model}/{method}.tsv"
    conda:
        "../../envs/train.yaml"
    script:
        "../scripts/train.py"


rule merge_adapter:
    input:
        model="results/models/{model}/base.json",
        adapter="results/training/{model}/{method}/adapter",
    output:
        merged=directory("results/models/{model}/{method}/merged"),
        manifest="results/models/{model}/{method}/manifest.json",
    params:
        dtype=config_param(settings.dtype),
        eval_step=config_param(settings.eval_step),
    priority: config_param(settings.chain_priority, 2)
    log:
        "logs/merge_adapter/{model}/{method}.log",
    benchmark:
        "logs/benchmarks/merge_adapter/{model}/{method}.tsv"
    conda:
        "../../envs/train.yaml"
    script:
        "../scripts/merge_adapter.py"


# Beyond the paper (evaluation.sweep_steps): a run's adapter at another saved step, merged and then
# generated and graded as any checkpoint (<run>-step<N>); training is never run again for it.


rule step_adapter:
    input:
        adapter="results/training/{model}/{method}/adapter",
    output:
        adapter=directory("results/training/{model}/{method}-step{step}/adapter"),
    wildcard_constraints:
        step=r"\d+",
    params:
        checkpoints=config_param(settings.checkpoint_root),
        eval_step=config_param(settings.eval_step),
    log:
        "logs/step_adapter/{model}/{method}-step{step}.log",
    benchmark:
        "logs/benchmarks/step_adapter/{model}/{method}-step{step}.tsv"
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/step_adapter.py"


use rule merge_adapter as merge_step_adapter with:
    input:
        model="results/models/{model}/base.json",
        adapter="results/training/{model}/{method}-step{step}/adapter",
    output:
        merged=directory("results/models/{model}/{method}-step{step}/merged"),
        manifest="results/models/{model}/{method}-step{step}/manifest.json",
    wildcard_constraints:
        step=r"\d+",
    params:
        dtype=config_param(settings.dtype),
        eval_step=config_param(settings.eval_step),
        step=config_param(settings.checkpoint_step),
    log:
        "logs/merge_adapter/{model}/{method}-step{step}.log",
    benchmark:
        "logs/benchmarks/merge_adapter/{model}/{method}-step{step}.tsv"


rule training_curves:
    input:
        logs=training_logs_of_model,
    output:
        pdf=report("results/figures/training_curves_{model}.pdf", caption="../report/training_curves.rst", category="Figures", labels={"figure": "training curves {model}"}),
        csv="results/figures/training_curves_{model}.csv",
        provenance="results/figures/training_curves_{model}.provenance.json",
    params:
        runs=config_param(settings.curve_runs),
    log:
        "logs/training_curves/{model}.log",
    benchmark:
        "logs/benchmarks/training_curves/{model}.tsv"
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/training_curves.py"


# Every configured training run, whether or not a table shows it: each model of training.models
# with each method of `methods`. Tables select runs; they do not define them. One run alone:
# `snakemake results/training/<model>/<method>/adapter`.
rule train_all:
    input:
        all_training_runs(),
