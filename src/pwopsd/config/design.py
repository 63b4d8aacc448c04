"""The experiment's design as a validated config states it: which models, methods, training runs
(one per training seed), eval seeds, tables and comparisons exist, and everything that determines
one rule's results (the settings rules pass as ``params``)."""

from __future__ import annotations

from pwopsd.config.schema import ConfigError

MAIN_SEED = "main"


def seed_names(cfg: dict) -> list[str]:
    return [str(s) for s in cfg["evaluation"]["seeds"]]


def sampling_seed(cfg: dict, seed_name: str) -> int | None:
    """The per-request seed for an evaluation seed name ("main" maps to ``evaluation.main_seed``)."""
    if seed_name == MAIN_SEED:
        return cfg["evaluation"]["main_seed"]
    return int(seed_name)


SAMPLING_KEYS = ("n", "temperature", "top_p", "top_k", "min_p", "max_new_tokens", "max_model_len", "enable_thinking",
                 "sample_streams")


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


def table_comparisons(cfg: dict, kind: str) -> list[tuple[str, str, str]]:
    """A table's (model, method, baseline) comparisons: every method of the table but the
    significance baseline, against the baseline of the same model."""
    baseline = (cfg.get("significance") or {}).get("baseline", "opsd")
    return [(mo, me, baseline) for mo, me in table_methods(cfg).get(kind, []) if me != baseline]


def significance_comparisons(cfg: dict) -> dict[str, list[tuple[str, str, str]]]:
    """Output name of each table with a significance test -> its comparisons (:func:`table_comparisons`)."""
    sig = cfg.get("significance") or {}
    runs, outputs = table_methods(cfg), {kind: out for out, kind in table_outputs(cfg).items()}
    return {outputs[kind]: table_comparisons(cfg, kind) for kind in sig.get("tables", []) if kind in runs and kind in outputs}


def comparison_runs(cfg: dict, comparisons: list[tuple[str, str, str]]) -> list[tuple[str, str]]:
    """(model, run) runs that comparisons read: every run of their methods and baselines."""
    return list(dict.fromkeys((mo, run) for mo, me, base in comparisons for m in (me, base) for run in method_runs(cfg, m)))


def significance_runs(cfg: dict, output: str) -> list[tuple[str, str]]:
    """(model, run) runs a significance table reads: every run of the table's methods and the baseline."""
    return comparison_runs(cfg, significance_comparisons(cfg)[output])


# -- the checkpoint sweep (evaluation.sweep_steps): a run's saved step N is the checkpoint <run>-stepN

STEP_MARK = "-step"


def step_checkpoint(run: str, step: int) -> str:
    """The checkpoint name of ``run``'s adapter saved at ``step`` (the run itself is its evaluation step)."""
    return f"{run}{STEP_MARK}{int(step)}"


def split_checkpoint(checkpoint: str) -> tuple[str, int | None]:
    """``(run, step)`` of a checkpoint name; ``step`` None for a run's evaluation-step checkpoint."""
    run, mark, step = checkpoint.rpartition(STEP_MARK)
    return (run, int(step)) if mark and step.isdigit() else (checkpoint, None)


def checkpoint_seed_names(cfg: dict, checkpoint: str) -> list[str]:
    """The eval seeds of a checkpoint: a swept step's are ``evaluation.sweep_seeds`` (default every
    eval seed), in the order of ``evaluation.seeds``."""
    sweep = cfg["evaluation"].get("sweep_seeds")
    if sweep and split_checkpoint(checkpoint)[1] is not None:
        chosen = {str(s) for s in sweep}
        return [name for name in seed_names(cfg) if name in chosen]
    return seed_names(cfg)


def sweep_steps(cfg: dict) -> list[int]:
    """Every step of the sweep plot and table: the listed saved steps and the evaluation step ([]:
    no sweep)."""
    listed = cfg["evaluation"].get("sweep_steps") or []
    return sorted({int(s) for s in listed} | {int(cfg["training"]["eval_step"])}) if listed else []


def sweep_outputs(cfg: dict) -> dict[str, str]:
    """Output name -> table kind of each swept table (``evaluation.sweep_tables``, when steps are listed)."""
    if not sweep_steps(cfg):
        return {}
    outputs = {kind: out for out, kind in table_outputs(cfg).items()}
    return {outputs[kind]: kind for kind in cfg["evaluation"].get("sweep_tables", []) if kind in outputs}


def sweep_checkpoints(cfg: dict, output: str) -> list[tuple[str, str]]:
    """(model, checkpoint) a swept table reads: each run of its comparisons at every swept step
    (the evaluation step is the run's own checkpoint)."""
    eval_step = int(cfg["training"]["eval_step"])
    runs = comparison_runs(cfg, table_comparisons(cfg, sweep_outputs(cfg)[output]))
    return [(mo, run if step == eval_step else step_checkpoint(run, step)) for step in sweep_steps(cfg) for mo, run in runs]


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
        "deterministic": tr["deterministic"],
        # an ablation only (the default, privileged, is TrainConfig's: existing runs keep their params)
        **({"teacher_prompt": meth["teacher_prompt"]} if meth["teacher_prompt"] != "privileged" else {}),
        # beyond the paper (small models): the same, so the paper's run keys stay as they were
        **({"teacher_transition": False} if not tr["teacher_transition"] else {}),
    }


def rollout_engine_settings(cfg: dict, model: str) -> dict:
    """The colocated vLLM rollout engine's settings for a model (its ``vllm`` entry, with the
    training memory fraction in place of the evaluation one)."""
    v = cfg["models"][model]["vllm"]  # schema defaults filled by validation
    return {"gpu_memory_utilization": v["train_gpu_memory_utilization"], "enforce_eager": v["enforce_eager"],
            "kv_cache_memory_gib": v["kv_cache_memory_gib"], "enable_chunked_prefill": v["enable_chunked_prefill"],
            "in_process": v["in_process"], "max_model_len": rollout_context(cfg), "check": cfg["training"]["rollout_check"],
            # where set only: the rule's params of runs without it stay as they were (no reruns)
            **({"block_size": v["block_size"]} if v["block_size"] is not None else {})}


# Room for a student prompt in the rollout engine's context when training.rollout_max_model_len is null.
ROLLOUT_PROMPT_TOKENS = 3072


def rollout_context(cfg: dict) -> int:
    """The rollout engine's context: ``training.rollout_max_model_len``, else the longest completion
    plus :data:`ROLLOUT_PROMPT_TOKENS`."""
    tr = cfg["training"]
    return int(tr.get("rollout_max_model_len") or tr["max_completion_length"] + ROLLOUT_PROMPT_TOKENS)


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
