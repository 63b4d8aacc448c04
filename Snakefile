# pwopsd-repro: reproduction workflow for "When Are Teacher Tokens Reliable? Position-Weighted
# On-Policy Self-Distillation for Reasoning" (PW-OPSD).
#
#   snakemake <target>                      paper configuration (config/config.yaml)
#   snakemake --directory tiny              tiny end-to-end run on a CPU (tiny/config/config.yaml)
#   snakemake --profile slurm <target>      Slurm cluster
#
# Paths below are relative to the working directory, so a run with --directory keeps its config
# and its results apart.

from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


# Cheap jobs and jobs that need the internet (Hub downloads) run on the submitting (login) node
# when a cluster executor is used.
localrules:
    all,
    train_all,
    prepare_benchmark,
    prepare_train_corpus,
    fetch_model,
    aggregate_metrics,
    table,
    schedules_figure,
    training_curves,
    reproduction_report,


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/generate.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/tables.smk"


if DIAGNOSTIC_MODEL:

    include: "workflow/rules/diagnostic.smk"


include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        all_data(),
        "results/metrics/summary.csv",
        all_tables_and_figures(),
