"""What every rule passes its script as ``params``, derived from the validated config.

Each function is pure, ``(config, wildcards[, ...]) -> value``, and rules use them through one
helper of ``workflow/rules/common.smk``::

    params:
        train=config_param(settings.training_run),
    threads: config_param(settings.generation_threads)

Params are what Snakemake compares between runs (``--rerun-triggers params``), so everything that
determines a result reaches a script this way. The exceptions are execution settings that change
speed, not results (Hub access, engine parallelism and batch sizes): scripts read those with
:func:`execution_settings`, so that moving a job to other GPUs does not rerun finished results.
"""

from __future__ import annotations

from typing import Any

from pwopsd import config as C

# -- data and models ---------------------------------------------------------------------------


def benchmark_entry(cfg: dict, wc) -> dict:
    return cfg["benchmarks"][wc.benchmark]


def train_corpus_entry(cfg: dict, wc) -> dict | None:
    return cfg.get("train_corpus")


def hub_model(cfg: dict, wc) -> dict:
    """Hub id and pinned revision of a model fetched by ``fetch_model``."""
    entry = cfg["models"][wc.model]
    return {"hf_id": entry["hf_id"], "revision": entry["revision"]}


def tiny_model(cfg: dict, wc) -> dict:
    return cfg.get("tiny", {})


def dtype(cfg: dict, wc) -> str:
    return cfg["models"][wc.model]["dtype"]


def chat_template(cfg: dict, wc) -> dict:
    return cfg["models"][wc.model]["chat_template"]


def gpus(cfg: dict, wc, stage: str) -> int:
    """GPUs of a model's stage (``generate`` / ``train`` / ``forward``), from its entry."""
    return int(cfg["models"][wc.model]["gpus"][stage])


# -- generation and evaluation -----------------------------------------------------------------


def benchmarks(cfg: dict, wc=None) -> list[str]:
    return list(cfg["benchmarks"])


def sampling(cfg: dict, wc) -> dict:
    return C.eval_sampling_settings(cfg)


def generation_seeds(cfg: dict, wc) -> dict[str, int | None]:
    """Seed name -> per-request seed of a generate job: its ``{seed}`` wildcard, or every
    evaluation seed of its checkpoint (:func:`pwopsd.config.checkpoint_seed_names`) when
    ``evaluation.seeds_per_job`` is ``all`` (the job has no seed wildcard)."""
    names = [wc.seed] if hasattr(wc, "seed") else C.checkpoint_seed_names(cfg, wc.checkpoint)
    return {name: C.sampling_seed(cfg, name) for name in names}


DIAGNOSTIC_PRIORITY = 10


def chain_priority(cfg: dict, wc, jobs_after: int) -> int:
    """Scheduling priority of a job of the train -> merge_adapter -> generate -> grade chain, with
    ``jobs_after`` jobs of the chain after it: heads first (``train`` 3 ... ``grade`` 0), so that
    long chains start early and the run does not end on one chain while the other cores idle; the
    runs of a method fitted to the diagnostic sit at the end of the DAG's longest path (diagnostic
    -> fit -> train -> evaluation), so they get ``DIAGNOSTIC_PRIORITY`` on top, as the diagnostic's
    phases do. Priorities only order ready jobs; they change no result."""
    name = getattr(wc, "method", None) or getattr(wc, "checkpoint", None)
    return jobs_after + (DIAGNOSTIC_PRIORITY if C.run_method(str(name)) in C.fitted_methods(cfg) else 0)


def job_seeds(cfg: dict, wc) -> list[str]:
    """The seed names a generate or grade job covers, in its outputs' order (see :func:`generation_seeds`)."""
    return list(generation_seeds(cfg, wc))


def seeds_per_job(cfg: dict) -> str:
    """``one`` (a generate job per checkpoint and seed: the cluster layout) or ``all`` (one job per
    checkpoint samples every seed: fewer process starts and model loads, for small models)."""
    return cfg["evaluation"]["seeds_per_job"]


def backend(cfg: dict, wc) -> str:
    return cfg["evaluation"]["backend"]


def generation_threads(cfg: dict, wc=None) -> int:
    return int(cfg["evaluation"]["threads"])


def grading(cfg: dict, wc=None) -> dict:
    return C.grading_options(cfg)


def grading_workers(cfg: dict, wc=None) -> int:
    return int(cfg["grading"]["workers"])


# -- training ----------------------------------------------------------------------------------


def training_run(cfg: dict, wc) -> dict:
    return C.training_config(cfg, wc.model, wc.method)


def training_processes(cfg: dict, wc) -> int:
    """The training processes of a run (one per GPU of ``gpus.train``, at least one): each takes
    its share of a step's problems, so their number is part of what a run is (a param, not only
    the job's GPU resource, which Snakemake does not compare when it decides what to rerun)."""
    return max(1, gpus(cfg, wc, "train"))


def training_threads(cfg: dict, wc=None) -> int:
    return int(cfg["training"]["threads"])


def tiny_threads(cfg: dict, wc=None) -> int:
    from pwopsd.tiny.examples import TinyBuildConfig  # the tiny recipe's settings and defaults

    return int(cfg.get("tiny", {}).get("threads", TinyBuildConfig.threads))


def eval_step(cfg: dict, wc=None) -> int | None:
    return cfg.get("training", {}).get("eval_step")


def checkpoint_root(cfg: dict, wc) -> str:
    """Where a run's checkpoint folders live (one per run key, see ``pwopsd.training.job``)."""
    return f"results/training/{wc.model}/{wc.method}/checkpoints"


def curve_runs(cfg: dict, wc) -> list[str]:
    """Runs whose training curves are drawn for a model: its runs that some table shows."""
    return [method for model, method in C.runs_in_tables(cfg) if model == wc.model]


# -- tables, figures, report -------------------------------------------------------------------


def table_spec(cfg: dict, wc) -> dict:
    kind = C.table_outputs(cfg)[wc.table]
    tables = cfg["tables"]
    methods = cfg.get("methods", {})
    shown = {m for _, m in C.table_methods(cfg)[kind]}  # only what the table shows: other methods' edits rerun nothing here
    return {"kind": kind, **tables[kind], "methods_config": {m: {"label": methods[m]["label"]} for m in sorted(shown)
                                                             if "label" in methods[m]},
            "benchmark_labels": tables.get("benchmark_labels", {}), "model_labels": tables.get("model_labels", {}),
            "n": cfg["evaluation"]["n"], "models": tables[kind].get("models") or list(cfg["models"])}


def _comparison_spec(cfg: dict, comparisons: list) -> dict:
    """What a comparison of a table's methods with the baseline reads and renders (significance and
    sweep): the comparisons, benchmarks, metrics, level, each method's runs and the labels."""
    sig, tables = cfg["significance"], cfg["tables"]
    methods = cfg.get("methods", {})
    names = {n for _, me, base in comparisons for n in (me, base)}
    return {"comparisons": [list(c) for c in comparisons], "benchmarks": benchmarks(cfg),
            "metrics": list(sig["metrics"]), "level": sig["level"], "n": cfg["evaluation"]["n"],
            # configured labels only: the tables print an unlabelled method's name LaTeX-escaped
            "method_labels": {n: methods[n]["label"] for n in sorted(names) if "label" in methods[n]},
            "runs": {n: C.method_runs(cfg, n) for n in sorted(names)},
            "benchmark_labels": tables.get("benchmark_labels", {}), "model_labels": tables.get("model_labels", {})}


def significance_spec(cfg: dict, wc) -> dict:
    """What rule ``significance`` computes for one table output: its comparisons, benchmarks,
    metrics, test settings and the labels of its rendering."""
    return _comparison_spec(cfg, C.significance_comparisons(cfg)[wc.table])


def sweep_spec(cfg: dict, wc) -> dict:
    """What rule ``sweep`` computes for one table output: :func:`significance_spec`'s settings for
    the table's comparisons, the swept steps and the evaluation step."""
    kind = C.sweep_outputs(cfg)[wc.table]
    return {**_comparison_spec(cfg, C.table_comparisons(cfg, kind)), "steps": C.sweep_steps(cfg),
            "eval_step": int(cfg["training"]["eval_step"])}


def checkpoint_step(cfg: dict, wc) -> int:
    """The training step of a merged checkpoint: a sweep checkpoint's own step (``<run>-step<N>``)."""
    return int(wc.step)


def schedules(cfg: dict, wc=None) -> dict[str, dict[str, Any]]:
    """The PW-OPSD schedules of the schedules table, by method: display name and (w_min, tau, s)
    (``None`` for a schedule fitted to the diagnostic: the figure reads it from the fit's file)."""
    methods = cfg.get("methods", {})
    names = cfg.get("tables", {}).get("schedules", {}).get("methods", [])
    return {n: {"label": C.plain_label(methods[n].get("label", n)),
                "params": None if methods[n].get("schedule_from") else [methods[n]["params"][k] for k in ("w_min", "tau", "s")]}
            for n in names}


def report_settings(cfg: dict, wc=None) -> dict:
    g = cfg["grading"]
    return {"diagnostic_model": C.diagnostic_model(cfg), "tiny": bool(C.built_models(cfg)),
            "verdicts": g["verdicts"], "graders": sorted(g["graders"])}


# -- branch-viability diagnostic ---------------------------------------------------------------


def diagnostic(cfg: dict, wc, *keys: str) -> dict:
    """The named parts of the diagnostic settings of the job's model."""
    model = getattr(wc, "model", None) or C.diagnostic_model(cfg)
    settings = C.diagnostic_settings(cfg, model)
    return {k: settings[k] for k in keys}


def diagnostic_datasets(cfg: dict, wc=None) -> list[str]:
    return list(cfg["diagnostic"]["datasets"])


def diagnostic_model_label(cfg: dict, wc=None) -> str:
    model = C.diagnostic_model(cfg)  # with no label, the name as LaTeX text (pwopsd.report.tables.latex_name)
    return cfg.get("tables", {}).get("model_labels", {}).get(model) or model.replace("_", r"\_")


# -- execution settings (not params) -----------------------------------------------------------


def execution_settings(cfg: dict, model: str | None = None) -> dict:
    """Settings that change how fast a job runs, not what it computes: read by scripts from
    ``snakemake.config`` so that changing them reruns nothing. ``hub`` (cache folder, offline
    mode) and, for a model, the generation backend's options (vLLM parallelism, HF batch size)."""
    out = {"hub": cfg.get("hub", {})}
    if model is not None:
        out["backend_options"] = C.backend_options(cfg, model)
    return out
