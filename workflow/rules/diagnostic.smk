# Branch-viability diagnostic (paper §3.2, Appendices A-B): one rule per phase, explicit files in
# between, all under results/diagnostic/{model}/. The diagnosed models are diagnostic.models (base
# checkpoints, no adapters); Table 1 and Figure 1 are drawn from the first.
#
#   A spines -> B teacher_pass -> C candidates -> D mc_dropout
#                                              -> E forced_continuation -> F viability_labels
#   G branch_scores (C, D, F) -> branch_auroc_table (Table 1), branch_auroc_figure (Figure 1)
#   G -> fit_schedule (beyond the paper) -> train of `schedule_from: diagnostic` methods, Figures 1B and 2
#
# A and E sample with the generation backend (vllm on the cluster, hf in tiny mode); B and D are
# HF forwards. Each rule's params hold exactly the settings its phase reads. The phases have a
# scheduling priority (settings.DIAGNOSTIC_PRIORITY, as the fitted method's train/evaluation jobs,
# settings.chain_priority): they lie on the DAG's longest path, so they start first among ready jobs.


localrules:
    branch_auroc_table,
    branch_auroc_figure,


rule spines:
    input:
        benchmarks=diagnostic_benchmarks,
        model="results/models/{model}/base.json",
    output:
        spines="results/diagnostic/{model}/spines.parquet",
    params:
        settings=config_param(settings.diagnostic, "datasets", "sample_seed", "student_prompt", "spine", "chat_template", "dtype"),
        datasets=config_param(settings.diagnostic_datasets),
        grading=config_param(settings.grading),
        backend=config_param(settings.backend),
    threads: config_param(settings.generation_threads)
    resources:
        gpu=config_param(settings.gpus, "generate"),
    priority: settings.DIAGNOSTIC_PRIORITY
    log:
        "logs/diagnostic/{model}/spines.log",
    benchmark:
        "logs/benchmarks/diagnostic/{model}/spines.tsv"
    conda:
        "../../envs/vllm.yaml"
    script:
        "../scripts/diagnostic_spines.py"


rule teacher_pass:
    input:
        spines=rules.spines.output.spines,
        model="results/models/{model}/base.json",
    output:
        teacher_pass="results/diagnostic/{model}/teacher_pass.parquet",
    params:
        settings=config_param(settings.diagnostic, "teacher_prompt", "teacher_pass", "candidates", "chat_template", "dtype"),
    threads: config_param(settings.generation_threads)
    resources:
        gpu=config_param(settings.gpus, "forward"),
    priority: settings.DIAGNOSTIC_PRIORITY
    log:
        "logs/diagnostic/{model}/teacher_pass.log",
    benchmark:
        "logs/benchmarks/diagnostic/{model}/teacher_pass.tsv"
    conda:
        "../../envs/train.yaml"
    script:
        "../scripts/diagnostic_teacher_pass.py"


rule candidates:
    input:
        spines=rules.spines.output.spines,
        teacher_pass=rules.teacher_pass.output.teacher_pass,
        model="results/models/{model}/base.json",
    output:
        candidates="results/diagnostic/{model}/candidates.parquet",
    params:
        settings=config_param(settings.diagnostic, "candidates", "teacher_pass"),
    priority: settings.DIAGNOSTIC_PRIORITY
    log:
        "logs/diagnostic/{model}/candidates.log",
    benchmark:
        "logs/benchmarks/diagnostic/{model}/candidates.tsv"
    conda:
        "../../envs/train.yaml"
    script:
        "../scripts/diagnostic_candidates.py"


rule mc_dropout:
    input:
        spines=rules.spines.output.spines,
        candidates=rules.candidates.output.candidates,
        model="results/models/{model}/base.json",
    output:
        mc_dropout="results/diagnostic/{model}/mc_dropout.parquet",
    params:
        settings=config_param(settings.diagnostic, "mc_dropout", "teacher_prompt", "chat_template", "dtype", "layers"),
    threads: config_param(settings.generation_threads)
    resources:
        gpu=config_param(settings.gpus, "forward"),
    priority: settings.DIAGNOSTIC_PRIORITY
    log:
        "logs/diagnostic/{model}/mc_dropout.log",
    benchmark:
        "logs/benchmarks/diagnostic/{model}/mc_dropout.tsv"
    conda:
        "../../envs/train.yaml"
    script:
        "../scripts/diagnostic_mc_dropout.py"


rule forced_continuation:
    input:
        spines=rules.spines.output.spines,
        candidates=rules.candidates.output.candidates,
        model="results/models/{model}/base.json",
    output:
        continuations="results/diagnostic/{model}/forced_continuations.parquet",
    params:
        settings=config_param(settings.diagnostic, "forced_continuation", "candidates", "dtype"),
        backend=config_param(settings.backend),
    threads: config_param(settings.generation_threads)
    resources:
        gpu=config_param(settings.gpus, "generate"),
    priority: settings.DIAGNOSTIC_PRIORITY
    log:
        "logs/diagnostic/{model}/forced_continuation.log",
    benchmark:
        "logs/benchmarks/diagnostic/{model}/forced_continuation.tsv"
    conda:
        "../../envs/vllm.yaml"
    script:
        "../scripts/diagnostic_forced_continuation.py"


rule viability_labels:
    input:
        spines=rules.spines.output.spines,
        candidates=rules.candidates.output.candidates,
        continuations=rules.forced_continuation.output.continuations,
    output:
        labels="results/diagnostic/{model}/labels.parquet",
    params:
        settings=config_param(settings.diagnostic, "labels"),
        grading=config_param(settings.grading),
    threads: config_param(settings.grading_workers)
    priority: settings.DIAGNOSTIC_PRIORITY
    log:
        "logs/diagnostic/{model}/viability_labels.log",
    benchmark:
        "logs/benchmarks/diagnostic/{model}/viability_labels.tsv"
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/diagnostic_labels.py"


rule branch_scores:
    input:
        spines=rules.spines.output.spines,
        candidates=rules.candidates.output.candidates,
        mc_dropout=rules.mc_dropout.output.mc_dropout,
        labels=rules.viability_labels.output.labels,
    output:
        scored="results/diagnostic/{model}/scored.parquet",
        summary="results/diagnostic/{model}/branch_auroc.json",
    params:
        settings=config_param(settings.diagnostic, "scores", "labels", "teacher_pass"),
    priority: settings.DIAGNOSTIC_PRIORITY
    log:
        "logs/diagnostic/{model}/branch_scores.log",
    benchmark:
        "logs/benchmarks/diagnostic/{model}/branch_scores.tsv"
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/diagnostic_scores.py"


rule fit_schedule:
    # Beyond the paper: the PW-OPSD schedule fitted to the model's forced-continuation outcomes by
    # normalized position (pwopsd.schedule); methods with `schedule_from: diagnostic` train with it.
    input:
        scored=rules.branch_scores.output.scored,
    output:
        schedule="results/diagnostic/{model}/fitted_schedule.json",
    params:
        settings=config_param(settings.diagnostic, "fit_schedule", "scores"),
    priority: settings.DIAGNOSTIC_PRIORITY
    log:
        "logs/diagnostic/{model}/fit_schedule.log",
    benchmark:
        "logs/benchmarks/diagnostic/{model}/fit_schedule.tsv"
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/fit_schedule.py"


rule branch_auroc_table:
    input:
        summary=f"results/diagnostic/{DIAGNOSTIC_MODEL}/branch_auroc.json",
    output:
        tex=report("results/tables/branch_auroc.tex", caption="../report/branch_auroc_table.rst", category="Tables", labels={"table": "branch_auroc", "format": "LaTeX"}),
        csv=report("results/tables/branch_auroc.csv", caption="../report/branch_auroc_table.rst", category="Tables", labels={"table": "branch_auroc", "format": "CSV"}),
        provenance="results/tables/branch_auroc.provenance.json",
    params:
        model_label=config_param(settings.diagnostic_model_label),
    log:
        "logs/tables/branch_auroc.log",
    benchmark:
        "logs/benchmarks/tables/branch_auroc.tsv"
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/branch_auroc_table.py"


rule branch_auroc_figure:
    input:
        scored=f"results/diagnostic/{DIAGNOSTIC_MODEL}/scored.parquet",
        fitted=f"results/diagnostic/{DIAGNOSTIC_MODEL}/fitted_schedule.json",
    output:
        pdf=report("results/figures/branch_auroc.pdf", caption="../report/branch_auroc_figure.rst", category="Figures", labels={"figure": "Figure 1 branch viability"}),
        csv="results/figures/branch_auroc.csv",
        scatter_pdf=report("results/figures/branch_auroc_scatter.pdf", caption="../report/branch_scatter.rst", category="Figures", labels={"figure": "branch viability scatter"}),
        scatter_csv="results/figures/branch_auroc_scatter.csv",
        provenance="results/figures/branch_auroc.provenance.json",
    params:
        settings=config_param(settings.diagnostic, "figure", "scores", "labels"),
    log:
        "logs/figures/branch_auroc.log",
    benchmark:
        "logs/benchmarks/figures/branch_auroc.tsv"
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/branch_auroc_figure.py"
