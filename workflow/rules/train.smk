# Training (one job per model x method), merging the evaluation-step adapter into a standalone
# checkpoint, and the training curves. Checkpoints every `training.save_every` steps go to a
# working directory (not a declared output) keyed by everything that determines the run: settings,
# base model content or pinned revision, corpus content, prompt switches, dtype, library versions
# and training code (pwopsd.train_job.run_key). A killed or preempted job resumes from its last
# checkpoint; a changed input restarts from step 0.


rule train:
    input:
        model="results/models/{model}/base.json",
        corpus="results/data/train_corpus.parquet",
    output:
        adapter=directory("results/training/{model}/{method}/adapter"),
        log="results/training/{model}/{method}/train_log.jsonl",
    params:
        train=lambda wc: cfgmod.training_config(config, wc.model, wc.method),
        eval_step=config.get("training", {}).get("eval_step"),
        dtype=lambda wc: config["models"][wc.model]["dtype"],
        chat_template=lambda wc: config["models"][wc.model]["chat_template"],
        work_root=lambda wc: f"results/training/{wc.model}/{wc.method}/checkpoints",
    threads: 2
    resources:
        gpu=gpus_for("train"),
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
        dtype=lambda wc: config["models"][wc.model]["dtype"],
        eval_step=config.get("training", {}).get("eval_step"),
    log:
        "logs/merge_adapter/{model}/{method}.log",
    benchmark:
        "logs/benchmarks/merge_adapter/{model}/{method}.tsv"
    conda:
        "../../envs/train.yaml"
    script:
        "../scripts/merge_adapter.py"


rule training_curves:
    input:
        logs=training_logs_of_model,
    output:
        pdf=report("results/figures/training_curves_{model}.pdf", caption="../report/training_curves.rst", category="Figures", labels={"figure": "training curves {model}"}),
        csv="results/figures/training_curves_{model}.csv",
        provenance="results/figures/training_curves_{model}.provenance.json",
    params:
        runs=lambda wc: [m for mo, m in trained_runs() if mo == wc.model],
    log:
        "logs/training_curves/{model}.log",
    benchmark:
        "logs/benchmarks/training_curves/{model}.tsv"
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/training_curves.py"
