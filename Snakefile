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


# A run that submits to Slurm, checked before any job (a dry run too): every rule whose jobs stop on
# notice is warned by the profile early enough to finish the piece in progress (a training step and
# its checkpoint, a generation shard, a grading pair, ...), and an attempt at the partition's limit
# holds that piece (pwopsd.cost.window_problems, cap_problems; docs/cluster.md, "Notice windows").
if SLURM_PROFILE is not None and workflow.exec_mode == ExecMode.DEFAULT:
    _rule_names = {r.name for r in workflow.rules}
    _late = costmod.window_problems(config, SLURM_PROFILE, _rule_names)
    if _late:
        raise WorkflowError("a time-limit warning of the Slurm profile cannot hold the work its jobs finish on "
                            "notice:\n  " + "\n  ".join(_late))
    _short = costmod.cap_problems(config, profile=SLURM_PROFILE, rules=_rule_names)
    if _short and clustermod.planning_flag(sys.argv[1:]) is None:
        raise WorkflowError("the partition's time limit is too short:\n  " + "\n  ".join(_short))
    for _problem in _short:
        logger.warning(_problem)


# The canary's first minute (config/smoke.yaml sets cluster.preflight): the preflight's login-node
# checks (python -m pwopsd.preflight: sbatch's answer to every GPU request, partitions and time
# limits, conda, each engine's memory, the sync folder) before any job is submitted.
if (SLURM_PROFILE is not None and workflow.exec_mode == ExecMode.DEFAULT and config["cluster"]["preflight"]
        and clustermod.planning_flag(sys.argv[1:]) is None):
    from pwopsd import preflight

    _methods = workflow.deployment_settings.deployment_method or ()
    _found = preflight.cluster_findings({"default-resources": dict(SLURM_PROFILE.defaults),
                                         "set-resources": {r: dict(v) for r, v in SLURM_PROFILE.per_rule.items()},
                                         "software-deployment-method": [str(getattr(m, "name", m)).lower() for m in _methods]},
                                        config)
    logger.info(f"preflight (cluster.preflight):\n{preflight.report(_found)}")
    if preflight.failed(_found):
        _lines = "\n  ".join(f"{f.message} -> change: {f.setting}" for f in preflight.failed(_found))
        raise WorkflowError(f"the preflight failed before any job (cluster.preflight; python -m pwopsd.preflight):\n  {_lines}")


# The code behind every result (issue 51): each rule that runs a script gets a param holding the
# digest of what the package modules its script imports do (pwopsd.keys.script_code_digest), so a
# change of the code that computed a finished result reruns it, as a change of its config does,
# and every result's provenance records it; comments and docstrings leave it alone. A user who keeps
# results made by older code says so with `code_changes: keep` (config/README.md). Digests computed
# before from the same sources are read back from the checkout's .snakemake/pwopsd/code_digests.json,
# shared by every working directory (pwopsd.script_digests).
if config["code_changes"] == "rerun":
    from pwopsd.script_digests import script_code_digests

    _scripts = {_rule: Path(_rule.snakefile).parent / _rule.script for _rule in workflow.rules if _rule.script}
    _digests = script_code_digests(_scripts.values(), cache=Path(workflow.basedir) / ".snakemake" / "pwopsd" / "code_digests.json")
    for _rule, _script in _scripts.items():
        if _digests[str(_script)]:
            _rule.set_params(code=_digests[str(_script)])


rule all:
    default_target: True
    input:
        all_data(),
        "results/metrics/summary.csv",
        all_tables_and_figures(),
