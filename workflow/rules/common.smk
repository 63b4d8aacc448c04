# Shared definitions: config validation, names, wildcard constraints and input functions.

import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from snakemake.exceptions import WorkflowError

from pwopsd import config as cfgmod

try:
    # Validates types, required and unknown keys (each message names the key) and fills defaults.
    _validated = cfgmod.validate_config(config)
except cfgmod.ConfigError as exc:
    raise WorkflowError(str(exc)) from None
config.clear()
config.update(_validated)

MODELS = list(config["models"])
HUB_MODELS = cfgmod.hub_models(config)
BUILT_MODELS = cfgmod.built_models(config)
BENCHMARKS = list(config["benchmarks"])
SEEDS = cfgmod.seed_names(config)
EVAL_MODELS = cfgmod.eval_models(config)
ENVS = Path(workflow.basedir) / "envs"


def _alternatives(names):
    # A regex matching exactly these names (a never-matching one when there are none).
    return "|".join(names) if names else "(?!x)x"


wildcard_constraints:
    model=_alternatives(MODELS),
    benchmark=_alternatives(BENCHMARKS),
    seed=_alternatives(SEEDS),
    checkpoint=r"[A-Za-z0-9_.\-]+",


# ---------------------------------------------------------------------------------------------
# Input functions and small lookups used by rules.


def model_entry(wildcards):
    return config["models"][wildcards.model]


def model_manifest(wildcards):
    """The manifest of the checkpoint a generation job samples from."""
    if wildcards.checkpoint == "base":
        return f"results/models/{wildcards.model}/base.json"
    return f"results/models/{wildcards.model}/{wildcards.checkpoint}/manifest.json"


def gpus_for(stage):
    """Resource function: GPUs of a model's stage (generate / train / forward) from its entry."""

    def _gpus(wildcards):
        return int(config["models"][wildcards.model]["gpus"][stage])

    return _gpus


def eval_sampling_settings(wildcards):
    return cfgmod.eval_sampling_settings(config)


def generation_backend(wildcards):
    return config["evaluation"]["backend"]




def evaluated_checkpoints():
    """(model, checkpoint) pairs that are evaluated; the base checkpoint of every evaluated model."""
    return [(m, "base") for m in EVAL_MODELS]


def all_seed_metrics(wildcards=None):
    return [
        f"results/metrics/{m}/{c}/{b}/seed-{s}.json"
        for m, c in evaluated_checkpoints()
        for b in BENCHMARKS
        for s in SEEDS
    ]


def all_data():
    """Every prepared dataset (benchmarks and, when configured, the training corpus)."""
    files = expand("results/data/benchmarks/{benchmark}.parquet", benchmark=BENCHMARKS)
    if config.get("train_corpus"):
        files.append("results/data/train_corpus.parquet")
    return files
