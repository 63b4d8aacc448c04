# Shared definitions: config validation, names, wildcard constraints and input functions.

import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from pwopsd.runtime import export_source_path

# Every job imports pwopsd from this workflow's src/, whatever environment runs it (the conda envs
# of envs/ hold third-party packages only, so nothing in them points back at the checkout). Jobs
# inherit PYTHONPATH; a cluster job re-reads this file on its node and sets it there too.
export_source_path(str(Path(workflow.basedir) / "src"))

from snakemake.exceptions import WorkflowError

from pwopsd import config as cfgmod
from pwopsd import settings
from pwopsd.generation.sampling import generation_path

from snakemake.logging import logger
from snakemake_interface_executor_plugins.settings import ExecMode

# The run's job events for `python -m pwopsd.status` (docs/status.md): the pwopsd logger plugin,
# attached by the workflow itself in the main process (unless --logger pwopsd did), so that every
# run records them, from any environment and with any profile. A dry run records nothing.
if workflow.exec_mode == ExecMode.DEFAULT:
    import snakemake_logger_plugin_pwopsd

    # (workflow.dryrun reads the executor, not yet set while the Snakefile is read; the output settings are)
    snakemake_logger_plugin_pwopsd.attach(dryrun=bool(getattr(workflow.output_settings, "dryrun", False)))

try:
    # Snakemake's own YAML reading keeps the last of two equal keys: read the config files again
    # strictly, so that a duplicated key is an error with its line numbers.
    # The files are merged again by pwopsd's rules (cfgmod.merge_configs: a data source of another
    # kind replaces the one before it, where Snakemake's merge would keep the old source's keys).
    # Snakemake applies the Snakefile's `configfile:` first and the command line's --configfile files
    # over it (workflow.configfiles lists the command line's first).
    _cli_files = list(workflow.overwrite_configfiles or [])
    _directive_files = [] if workflow.config_settings.replace_workflow_config else workflow.configfiles[len(_cli_files):]
    if _directive_files or _cli_files:
        _merged = cfgmod.merge_config_files(_directive_files + _cli_files)
        config.clear()
        config.update(_merged)
    # `--config 'evaluation={n: 3}'` hands nested values over as strings: type them by the schema.
    _overrides = dict(workflow.config_settings.config or {})
    if _overrides:
        _overrides = cfgmod.typed_overrides(config, _overrides)
        logger.info("config overrides (--config): " + "; ".join(cfgmod.override_lines(_overrides)))
    # Validates types, required and unknown keys (each message names the key) and fills defaults.
    _validated = cfgmod.validate_config(cfgmod.merge_configs(config, _overrides))
except cfgmod.ConfigError as exc:
    raise WorkflowError(str(exc)) from None
config.clear()
config.update(_validated)

# One CPU kernel path for every job (config cpu_kernel_path; tiny mode: avx2), so that CPU results
# are the same on every host that can take it. Jobs inherit the variable, Slurm jobs too.
# How CPU float32 matrix products are computed (config cpu_matmul; tiny mode: exact, the same bits on
# every CPU vendor, pwopsd.exact_matmul), set first: the kernel path's pin depends on it.
# torch.compile's kernel cache follows the kernel path (torch keys it without the instruction set:
# pwopsd.runtime.pin_compile_cache).
from pwopsd.runtime import pin_compile_cache, pin_kernel_path, pin_matmul

CPU_MATMUL = pin_matmul(config["cpu_matmul"])
KERNEL_PATH, _kernel_note = pin_kernel_path(config["cpu_kernel_path"])
if _kernel_note:
    logger.warning(_kernel_note)
pin_compile_cache(KERNEL_PATH)

# A run with the Slurm profile (--profile slurm): stop on the profile's CHANGE_ME placeholders before
# any job, but let a run that submits nothing (-n, --dag, --rulegraph, --summary, ...) show its plan
# with one warning; give jobs the threads the profile grants (not this login node's core count,
# which `cores: all` of profiles/default would impose, also on how many jobs run at once) and cap
# runtimes at the partition maximum.
from pwopsd import cluster as clustermod
from pwopsd.notice import NOTICE_GRACE_SECONDS

_slurm_defaults = clustermod.resource_args(workflow.resource_settings.default_resources)
if clustermod.submits_to_slurm(_slurm_defaults):
    from snakemake.resources import Resource
    from snakemake_interface_executor_plugins.settings import ExecMode

    _unset = clustermod.placeholder_problems(_slurm_defaults, workflow.resource_settings.overwrite_resources)
    if _unset:
        _planning = clustermod.planning_flag(sys.argv[1:])
        if _planning is None:
            raise WorkflowError("the Slurm profile is not set up:\n  " + "\n  ".join(_unset))
        logger.warning(f"the Slurm profile is not set up ({_planning} submits nothing, so the plan follows; "
                       "a run stops here until these are set):\n  " + "\n  ".join(_unset))
    workflow.global_resources["_cores"] = Resource("_cores", sys.maxsize)
    clustermod.export_max_runtime(config["cluster"]["max_runtime_min"])
    # What sbatch will get: the profile's runtimes and time-limit warnings (with any --set-resources
    # of the command line). Each job that stops on notice must be warned early enough to finish its
    # piece in progress, and an attempt at the partition's limit must hold that piece: checked in the
    # Snakefile once every rule is defined (pwopsd.cost.window_problems, cap_problems).
    from pwopsd import cost as costmod

    SLURM_PROFILE = clustermod.Profile.from_settings(workflow.resource_settings, sys.argv[1:])
    # A training longer than an attempt's limit runs over several attempts, each stopped on notice
    # before the limit and resumed from its checkpoint (pwopsd.notice): the train rule's retries come
    # from the cost plan, attempt k limited to the profile's min(base x k, cluster.max_runtime_min).
    # Only the main process retries: Snakemake runs a submitted job with --retries 0 in the job,
    # but a rule's own `retries:` would make the job's Snakemake rerun a job stopped on notice
    # inside the same allocation (measured on the test Slurm), with the notice already spent and
    # only the notice window of the time limit left; the main process submits a new job instead.
    try:
        TRAIN_RETRIES = costmod.train_retries(config, profile=SLURM_PROFILE) if workflow.exec_mode == ExecMode.DEFAULT else 0
    except ValueError as exc:  # a runtime the profile writes in a way the cost plan cannot read
        raise WorkflowError(str(exc)) from None
    # torchrun waits this long for the ranks' checkpoint after passing the warning on (rule train).
    _train_warning = SLURM_PROFILE.limits("train").warning
    TRAIN_NOTICE_SECONDS = _train_warning.seconds if _train_warning else NOTICE_GRACE_SECONDS
else:
    SLURM_PROFILE = None
    TRAIN_RETRIES = None  # a local run: Snakemake's --retries
    TRAIN_NOTICE_SECONDS = NOTICE_GRACE_SECONDS

MODELS = list(config["models"])
HUB_MODELS = cfgmod.hub_models(config)
BUILT_MODELS = cfgmod.built_models(config)
BENCHMARKS = list(config["benchmarks"])
SEEDS = cfgmod.seed_names(config)
EVAL_MODELS = cfgmod.eval_models(config)
METHODS = list(config.get("methods", {}))
RUNS = [run for method in METHODS for run in cfgmod.method_runs(config, method)]  # a method per training seed
TABLE_RUNS = cfgmod.table_runs(config)
DIAGNOSTIC_MODELS = cfgmod.diagnostic_models(config)
DIAGNOSTIC_MODEL = cfgmod.diagnostic_model(config)  # Table 1 and Figure 1
FITTED_METHODS = cfgmod.fitted_methods(config)
TABLE_OUTPUTS = cfgmod.table_outputs(config)
SIGNIFICANCE_OUTPUTS = list(cfgmod.significance_comparisons(config))
SWEEP_OUTPUTS = list(cfgmod.sweep_outputs(config))  # beyond the paper: evaluation.sweep_steps
# A generate job per seed (its {seed} wildcard) or one for every seed of a checkpoint.
if settings.seeds_per_job(config) == "one":
    GENERATION_SEEDS, GENERATION_SEED_NAME = ["{seed}"], "{seed}"
else:
    GENERATION_SEEDS, GENERATION_SEED_NAME = SEEDS, "all"
# A cheaper sweep (evaluation.sweep_seeds) with one generate job for all of a checkpoint's seeds:
# the swept steps' jobs have their own outputs (rules generate_sweep_step, grade_sweep_step).
SWEEP_SEEDS = cfgmod.checkpoint_seed_names(config, cfgmod.step_checkpoint("run", 1))
SWEEP_JOBS_OF_THEIR_OWN = bool(SWEEP_OUTPUTS) and GENERATION_SEED_NAME == "all" and SWEEP_SEEDS != SEEDS
SWEEP_CHECKPOINT = rf"[A-Za-z0-9_.\-]+{cfgmod.STEP_MARK}\d+"


def _alternatives(names):
    # A regex matching exactly these names (a never-matching one when there are none).
    return "|".join(names) if names else "(?!x)x"


wildcard_constraints:
    model=_alternatives(MODELS),
    method=_alternatives(RUNS),
    table=_alternatives(list(TABLE_OUTPUTS)),
    benchmark=_alternatives(BENCHMARKS),
    seed=_alternatives(SEEDS),
    checkpoint=r"[A-Za-z0-9_.\-]+",


# ---------------------------------------------------------------------------------------------
# Rule params: one idiom. `config_param(settings.x, *args)` calls the pure function
# `pwopsd.settings.x(config, wildcards, *args)` when the job is planned (params, threads and
# resources alike); the derivations live and are tested in the package.


def config_param(derive, *args):
    def _param(wildcards):
        return derive(config, wildcards, *args)

    return _param


# ---------------------------------------------------------------------------------------------
# Input functions: which files a job reads.


def model_manifest(wildcards):
    """The manifest of the checkpoint a generation job samples from."""
    if wildcards.checkpoint == "base":
        return f"results/models/{wildcards.model}/base.json"
    return f"results/models/{wildcards.model}/{wildcards.checkpoint}/manifest.json"


def runs_in_tables():
    """(model, method) training runs that some table shows, in first-use order."""
    return cfgmod.runs_in_tables(config)


def evaluated_checkpoints():
    """(model, checkpoint): the base checkpoint of every evaluated model and every trained run."""
    return [(m, "base") for m in EVAL_MODELS] + runs_in_tables()


def fitted_schedule_file(model):
    return f"results/diagnostic/{model}/fitted_schedule.json"


def train_inputs(wildcards):
    """The base model and the corpus; for a method that takes its schedule from the diagnostic
    (`schedule_from: diagnostic`), also the model's fitted schedule: diagnostic -> fit -> train."""
    files = {"model": f"results/models/{wildcards.model}/base.json", "corpus": "results/data/train_corpus.parquet"}
    if cfgmod.run_method(wildcards.method) in FITTED_METHODS:
        files["schedule"] = fitted_schedule_file(wildcards.model)
    return files


def schedules_figure_inputs(wildcards):
    """Figure 2 reads the fitted schedule of the schedules table's model when the table has a fitted method."""
    spec = config.get("tables", {}).get("schedules", {})
    if any(m in FITTED_METHODS for m in spec.get("methods", [])):
        return {"fitted": fitted_schedule_file(spec["model"])}
    return {}


def seed_metrics(runs):
    """Per-seed metrics of (model, checkpoint) pairs: every eval seed of each checkpoint (a swept
    step's: evaluation.sweep_seeds)."""
    return [f"results/metrics/{m}/{c}/{b}/seed-{s}.json" for m, c in runs for b in BENCHMARKS
            for s in cfgmod.checkpoint_seed_names(config, c)]


def all_seed_metrics(wildcards=None):
    return seed_metrics(evaluated_checkpoints())


def table_metrics(wildcards):
    return seed_metrics(TABLE_RUNS[TABLE_OUTPUTS[wildcards.table]])


def significance_metrics(wildcards):
    return seed_metrics(cfgmod.significance_runs(config, wildcards.table))


def sweep_metrics(wildcards):
    """A swept table's seed metrics: every run of its comparisons at every swept step, and the base model."""
    checkpoints = cfgmod.sweep_checkpoints(config, wildcards.table)
    return seed_metrics(checkpoints + [(checkpoints[0][0], "base")])


def training_logs_of_model(wildcards):
    return [f"results/training/{wildcards.model}/{m}/train_log.jsonl" for m in settings.curve_runs(config, wildcards)]


def all_tables_and_figures():
    files = [f"results/tables/{name}.tex" for name in TABLE_OUTPUTS]
    files += [f"results/tables/significance_{name}.tex" for name in SIGNIFICANCE_OUTPUTS]
    files += [f"results/tables/sweep_{name}.tex" for name in SWEEP_OUTPUTS]
    if config.get("tables", {}).get("schedules"):
        files.append("results/figures/pwopsd_schedules.pdf")
    files += [f"results/figures/training_curves_{m}.pdf" for m in dict.fromkeys(mo for mo, _ in runs_in_tables())]
    if DIAGNOSTIC_MODEL:
        files += ["results/tables/branch_auroc.tex", "results/figures/branch_auroc.pdf"]
    files += [f"results/diagnostic/{m}/branch_auroc.json" for m in DIAGNOSTIC_MODELS]
    files += [fitted_schedule_file(m) for m in DIAGNOSTIC_MODELS]
    return files + ["results/report/reproduction.md"]


def reproduction_inputs(wildcards):
    files = {"summary": "results/metrics/summary.csv",
             "reference": str(Path(workflow.basedir) / "workflow" / "reference" / "paper_results.csv")}
    if DIAGNOSTIC_MODEL:
        files["branch"] = f"results/diagnostic/{DIAGNOSTIC_MODEL}/branch_auroc.json"
    files["significance"] = [f"results/tables/significance_{name}.csv" for name in SIGNIFICANCE_OUTPUTS]
    files["sweep"] = [f"results/tables/sweep_{name}.csv" for name in SWEEP_OUTPUTS]
    return files


def local_source_file(entry):
    """A dataset entry's local file as a declared input, so that editing the file reruns its
    prepare job and everything downstream. A file that is not there yet is left out of the DAG
    (the paper's HMMT parquet is not distributed, and a dry run must still plan); the prepare job
    then fails naming `<key>.source.path` and the file."""
    source = (entry or {}).get("source", {})
    if source.get("kind") != "local" or not Path(source["path"]).is_file():
        return []
    return [source["path"]]


def benchmark_source_file(wildcards):
    return local_source_file(config["benchmarks"][wildcards.benchmark])


def train_corpus_source_file(wildcards):
    return local_source_file(config.get("train_corpus"))


def all_training_runs():
    """Adapters of every configured run (target train_all): each trained model with each method."""
    return [f"results/training/{m}/{meth}/adapter" for m, meth in cfgmod.training_runs(config)]


def all_data():
    """Every prepared dataset (benchmarks and, when configured, the training corpus)."""
    files = expand("results/data/benchmarks/{benchmark}.parquet", benchmark=BENCHMARKS)
    if config.get("train_corpus"):
        files.append("results/data/train_corpus.parquet")
    return files


# Branch-viability diagnostic (diagnostic.smk).


def diagnostic_benchmarks(wildcards):
    return [f"results/data/benchmarks/{name}.parquet" for name in config["diagnostic"]["datasets"]]


