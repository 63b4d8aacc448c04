# Data preparation: every benchmark and the training corpus become normalized parquet tables
# (id, problem, answer[, solution] + source fields) with a manifest of what was used.
# The hub settings (cache dir, offline) are execution settings the script reads from the config.
# A local source file is a declared input (an edit reruns the dataset and what depends on it); a
# Hub source is pinned by its 40-hex revision, a param.


rule prepare_benchmark:
    input:
        source=benchmark_source_file,
    output:
        table="results/data/benchmarks/{benchmark}.parquet",
        manifest="results/data/benchmarks/{benchmark}.json",
    params:
        entry=config_param(settings.benchmark_entry),
    log:
        "logs/data/prepare_benchmark/{benchmark}.log",
    benchmark:
        "logs/benchmarks/data/prepare_benchmark/{benchmark}.tsv"
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/prepare_dataset.py"


rule prepare_train_corpus:
    input:
        source=train_corpus_source_file,
    output:
        table="results/data/train_corpus.parquet",
        manifest="results/data/train_corpus.json",
    params:
        entry=config_param(settings.train_corpus_entry),
    log:
        "logs/data/prepare_train_corpus.log",
    benchmark:
        "logs/benchmarks/data/prepare_train_corpus.tsv"
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/prepare_dataset.py"
