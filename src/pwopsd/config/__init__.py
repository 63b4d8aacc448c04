"""The workflow's configuration, one idea a module:

- :mod:`~pwopsd.config.schema`: the JSON Schema (``workflow/schemas/config.schema.yaml``), its
  defaults, and :class:`ConfigError`;
- :mod:`~pwopsd.config.validation`: a config checked against the schema and across fields, every
  problem one line naming its key;
- :mod:`~pwopsd.config.files`: config files read strictly (no key twice) and overlays merged as
  Snakemake merges ``--configfile`` files;
- :mod:`~pwopsd.config.overrides`: ``--config`` command-line values typed by the schema;
- :mod:`~pwopsd.config.design`: what a validated config says the experiment is (models, methods,
  training runs, eval seeds, tables, comparisons) and the settings that determine each rule's
  results.

Nothing here imports the rest of the package: a loss's parameters come from the loss registry
(:func:`pwopsd.training.registry.loss_keywords`), which reads the schema's defaults from here.
The names below are re-exported so that callers write ``from pwopsd.config import load_config``.
"""

from pwopsd.config.design import (  # noqa: F401
    MAIN_SEED, seed_names, sampling_seed, SAMPLING_KEYS, eval_sampling_settings, backend_options,
    grading_options, trained_models, RUN_SEED, method_seeds, method_runs, run_method, run_seed, table_methods,
    table_runs, plain_label, runs_in_tables, training_runs, significance_comparisons, significance_runs,
    table_outputs, training_config, rollout_engine_settings, eval_models, hub_models, built_models,
    diagnostic_models, diagnostic_model, fitted_methods, diagnostic_settings, table_comparisons, comparison_runs,
    STEP_MARK, step_checkpoint, split_checkpoint, sweep_steps, sweep_outputs, sweep_checkpoints, checkpoint_seed_names,
)
from pwopsd.config.files import load_config, load_config_files, merge_config_files, merge_configs, read_yaml_strict  # noqa: F401
from pwopsd.config.overrides import flat_items, override_lines, typed_overrides  # noqa: F401
from pwopsd.config.schema import SCHEMA_PATH, ConfigError, load_schema, schema_defaults  # noqa: F401
from pwopsd.config.validation import FITTED_PARAMS, validate_config  # noqa: F401
