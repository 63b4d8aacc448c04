"""Config schema: the shipped configs validate; each kind of mistake is rejected naming its key."""

import copy

import pytest
import yaml

from conftest import PAPER_MODELS, REPO, run_snakemake
from pwopsd.config import ConfigError, load_config, sampling_seed, seed_names, validate_config


@pytest.fixture(scope="module")
def paper():
    with open(REPO / "config" / "config.yaml") as fh:
        return yaml.safe_load(fh)


def test_shipped_configs_validate_and_fill_defaults():
    paper = load_config(REPO / "config" / "config.yaml")
    assert tuple(m for m in paper["models"] if m in PAPER_MODELS) == PAPER_MODELS  # beside any a user adds
    assert paper["evaluation"]["min_p"] == 0.0  # default filled
    assert paper["hub"]["cache_dir"] is None
    tiny = load_config(REPO / "tiny" / "config" / "config.yaml")
    assert tiny["models"]["tiny_qwen3"]["vllm"]["tensor_parallel_size"] == 1  # nested default
    raw = yaml.safe_load((REPO / "tiny" / "config" / "config.yaml").read_text())
    del raw["benchmarks"]["arith_l1"]["source"]["max_operand"]
    assert validate_config(raw)["benchmarks"]["arith_l1"]["source"]["max_operand"] == 30  # default inside if/then
    assert tiny["benchmarks"]["arith_l1"]["columns"]["id"] == "id"


def test_paper_protocol_values():
    ev = load_config(REPO / "config" / "config.yaml")["evaluation"]
    assert (ev["n"], ev["temperature"], ev["top_p"], ev["top_k"]) == (12, 1.0, 0.95, -1)
    assert (ev["max_new_tokens"], ev["max_model_len"], ev["enable_thinking"]) == (38912, 40960, True)


def _mutate(cfg, path, value, delete=False):
    node = cfg
    for p in path[:-1]:
        node = node.setdefault(p, {})
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return cfg


MISTAKES = [
    # (description, path, value, delete, expected key in message, expected words)
    ("unknown top-level key", ["evaluaton"], {}, False, "evaluaton", "unknown key"),
    ("unknown model key", ["models", "qwen3_4b", "tp"], 4, False, "models.qwen3_4b.tp", "unknown key"),
    ("wrong dtype enum", ["models", "qwen3_4b", "dtype"], "bf16", False, "models.qwen3_4b.dtype", "is not one of"),
    ("wrong type n", ["evaluation", "n"], "twelve", False, "evaluation.n", "is not of type"),
    ("missing gpus", ["models", "qwen3_4b", "gpus"], None, True, "models.qwen3_4b.gpus", "required key is missing"),
    ("missing eval field", ["evaluation", "max_new_tokens"], None, True, "evaluation.max_new_tokens", "required"),
    ("top_p out of range", ["evaluation", "top_p"], 1.5, False, "evaluation.top_p", "maximum"),
    ("bad seed", ["evaluation", "seeds"], ["main", "one"], False, "evaluation.seeds.1", "not a seed"),
    ("bad sha256", ["benchmarks", "hmmt_feb2025", "source", "sha256"], "xyz", False, "benchmarks.hmmt_feb2025.source.sha256", "does not match"),
    ("hf source without revision", ["benchmarks", "math500", "source", "revision"], None, True, "benchmarks.math500.source.revision", "required"),
    ("unknown source kind", ["benchmarks", "math500", "source", "kind"], "s3", False, "benchmarks.math500.source.kind", "is not one of"),
    ("bad model name", ["models", "Qwen-4B"], {"hf_id": "a/b", "dtype": "bfloat16", "gpus": {"generate": 1, "train": 1, "forward": 1}}, False, "models", "not a valid name"),
    ("tp x dp != gpus", ["models", "qwen3_4b", "vllm", "tensor_parallel_size"], 2, False, "models.qwen3_4b.vllm", "must equal"),
    ("in-process vLLM with TP 4", ["models", "qwen3_4b", "vllm", "in_process"], True, False, "models.qwen3_4b.vllm.in_process", "needs tensor_parallel_size 1"),
    ("KV cache of 0 GiB", ["models", "qwen3_4b", "vllm", "kv_cache_memory_gib"], 0, False, "models.qwen3_4b.vllm.kv_cache_memory_gib", "less than or equal to the minimum"),
    ("hf_id and built_by", ["models", "qwen3_4b", "built_by"], "tiny", False, "models.qwen3_4b", "exactly one"),
    ("eval model not configured", ["evaluation", "models"], ["qwen3_4b", "llama"], False, "evaluation.models.1", "not a configured model"),
    ("prompt room", ["evaluation", "max_new_tokens"], 40960, False, "evaluation.max_new_tokens", "no room"),
    ("diagnostic dataset", ["diagnostic", "datasets", "aime2026"], 30, False, "diagnostic.datasets.aime2026", "not a configured benchmark"),
    ("diagnostic count above benchmark", ["diagnostic", "datasets", "aime2024"], 31, False, "diagnostic.datasets.aime2024", "the benchmark has 30"),
    ("reopold lam of 1", ["methods", "reopold", "params", "lam"], 1, False, "methods.reopold.params.lam", "maximum"),
    ("reopold t_switch", ["methods", "reopold", "params", "t_switch"], -1, False, "methods.reopold.params.t_switch", "minimum"),
    ("diagnostic model", ["diagnostic", "models"], ["qwen3_4b", "llama"], False, "diagnostic.models.1", "not a configured model"),
    ("old diagnostic.model key", ["diagnostic", "model"], "qwen3_4b", False, "diagnostic.model", "unknown key"),
    ("fitted and hand-picked schedule", ["methods", "pwopsd_fitted", "params"], {"tau": 0.3}, False, "methods.pwopsd_fitted.params.tau", "remove one of them"),
    ("fitted schedule on a non-pwopsd loss", ["methods", "opsd", "schedule_from"], "diagnostic", False, "methods.opsd.schedule_from", "only a pwopsd method"),
    ("fitted method without that model's diagnostic", ["tables", "cross_model", "methods"], ["opsd", "pwopsd_fitted"], False, "tables.cross_model", "not in diagnostic.models"),
    ("fit bootstrap", ["diagnostic", "fit_schedule", "min_candidates"], 2, False, "diagnostic.fit_schedule.min_candidates", "minimum"),
    ("diagnostic labels", ["diagnostic", "labels", "v_low"], 0.9, False, "diagnostic.labels.v_low", "must not exceed"),
    ("diagnostic unknown key", ["diagnostic", "candidates", "spaceing"], 64, False, "diagnostic.candidates.spaceing", "unknown key"),
    ("diagnostic schedule", ["diagnostic", "figure", "schedule"], "pwopsd_gentle", False, "diagnostic.figure.schedule", "not a configured method"),
    ("figure schedule of another loss", ["diagnostic", "figure", "schedule"], "opsd", False, "diagnostic.figure.schedule", "must be a pwopsd method"),
    ("benchmark named mean", ["benchmarks", "mean"], {"source": {"kind": "tiny", "n": 4, "levels": [1], "seed": 1}}, False, "benchmarks.mean", "mean column"),
    ("method twice in a table", ["tables", "main", "methods"], ["opsd", "eopd", "opsd"], False, "tables.main.methods", "listed more than once"),
    ("figure schedule fitted", ["diagnostic", "figure", "schedule"], "pwopsd_fitted", False, "diagnostic.figure.schedule", "must be a pwopsd method"),
    ("w_min above 1", ["methods", "pwopsd_moderate", "params", "w_min"], 1.5, False, "methods.pwopsd_moderate.params.w_min", "maximum"),
    ("tau above 1", ["methods", "pwopsd_moderate", "params", "tau"], 2, False, "methods.pwopsd_moderate.params.tau", "maximum"),
    ("s zero", ["methods", "pwopsd_moderate", "params", "s"], 0, False, "methods.pwopsd_moderate.params.s", "minimum"),
    ("reduction typo", ["methods", "pwopsd_moderate", "params", "reduction"], "globl", False, "methods.pwopsd_moderate.params.reduction", "is not one of"),
    ("renamed loss key", ["methods", "pwopsd_moderate", "params", "wmin"], 0.2, False, "methods.pwopsd_moderate.params.wmin", "unknown key"),
    ("opsd takes no params", ["methods", "opsd", "params"], {"w_min": 0.5}, False, "methods.opsd.params.w_min", "unknown key"),
    ("eopd top_k", ["methods", "eopd", "params", "top_k"], 0, False, "methods.eopd.params.top_k", "minimum"),
    ("reopold lam", ["methods", "reopold", "params", "lam"], 0, False, "methods.reopold.params.lam", "minimum"),
    ("branch as model revision", ["models", "qwen3_4b", "revision"], "main", False, "models.qwen3_4b.revision", "does not match"),
    ("short model revision", ["models", "qwen3_4b", "revision"], "1cfa9a7", False, "models.qwen3_4b.revision", "does not match"),
    ("missing model revision", ["models", "qwen3_4b", "revision"], None, True, "models.qwen3_4b.revision", "required for a Hub model"),
    ("branch as dataset revision", ["benchmarks", "math500", "source", "revision"], "main", False, "benchmarks.math500.source.revision", "does not match"),
    ("duplicate table output", ["tables", "schedules", "output"], "main_4b", False, "tables.schedules.output", "already the output of tables.main"),
    ("max runtime", ["cluster", "max_runtime_min"], 0, False, "cluster.max_runtime_min", "minimum"),
    ("h_trunc reading", ["diagnostic", "teacher_pass", "h_trunc"], "top16", False, "diagnostic.teacher_pass.h_trunc", "is not one of"),
    ("top_m_valid with top_k = top_m", ["diagnostic", "teacher_pass", "h_trunc"], "top_m_valid", False, "diagnostic.teacher_pass.h_trunc", "top_k > top_m"),
    ("top_m above top_k", ["diagnostic", "teacher_pass", "top_m"], 32, False, "diagnostic.teacher_pass.top_m", "stored tokens"),
    ("sample streams", ["evaluation", "sample_streams"], "per_problem", False, "evaluation.sample_streams", "is not one of"),
    ("orientation", ["diagnostic", "scores", "orientation"], "oriented", False, "diagnostic.scores.orientation", "is not one of"),
    ("verdicts grader", ["grading", "verdicts"], "official", False, "grading.verdicts", "not one of grading.graders"),
    ("grader option", ["grading", "graders", "corrected", "empty_box"], "none", False, "grading.graders.corrected.empty_box", "is not one of"),
    ("grader name", ["grading", "graders", "Corrected v2"], {"string_fallback": "exception", "gold_wrapping": "dollar", "empty_box": "empty"}, False, "grading.graders", "not a valid name"),
    ("old grading key", ["grading", "string_fallback"], "exception", False, "grading.string_fallback", "unknown key"),
    ("old training.seed key", ["training", "seed"], 42, False, "training.seed", "replaced by training.seeds"),
    ("repeated training seed", ["training", "seeds"], [42, 42], False, "training.seeds", "non-unique"),
    ("significance baseline", ["significance", "baseline"], "sft", False, "significance.baseline", "not a configured method"),
    ("significance metric", ["significance", "metrics"], ["avg", "median"], False, "significance.metrics.1", "is not one of"),
]


@pytest.mark.parametrize("desc,path,value,delete,key,words", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_mistake_is_rejected_naming_the_key(paper, desc, path, value, delete, key, words):
    bad = _mutate(copy.deepcopy(paper), path, value, delete)
    with pytest.raises(ConfigError) as info:
        validate_config(bad)
    msg = str(info.value)
    assert key in msg, msg
    assert words in msg, msg


def test_min_p_with_the_hf_backend_is_rejected(paper):
    """The hf sampler has no min-p filter: the value would be recorded in the generations, not applied."""
    bad = copy.deepcopy(paper)
    bad["evaluation"].update(backend="hf", min_p=0.05)
    with pytest.raises(ConfigError, match=r"evaluation.min_p: 0.05 with evaluation.backend: hf"):
        validate_config(bad)
    bad["evaluation"]["min_p"] = 0.0
    validate_config(bad)


def test_a_model_trained_for_a_table_has_its_batch_checked_too(paper):
    """training.models names what train_all trains; a table's rows train their models as well, and
    each must make training.effective_batch."""
    bad = copy.deepcopy(paper)
    bad["training"]["models"] = ["qwen3_4b"]
    bad["models"]["dsr1_llama_8b"]["train"]["gradient_accumulation_steps"] *= 2  # Table 4 trains it
    with pytest.raises(ConfigError, match=r"models.dsr1_llama_8b.train: .* but training.effective_batch is 32"):
        validate_config(bad)


def test_a_typo_in_training_models_is_named_not_a_traceback(paper):
    """An unknown name in training.models is one problem naming its key (the batch check of every
    trained model read the entry and stopped with a KeyError before)."""
    bad = copy.deepcopy(paper)
    bad["training"]["models"] = ["qwen3_4b", "qwen3_17b"]
    with pytest.raises(ConfigError, match=r"training.models.1: 'qwen3_17b' is not a configured model"):
        validate_config(bad)


def test_all_problems_reported_at_once(paper):
    bad = copy.deepcopy(paper)
    bad["evaluation"]["n"] = "x"
    bad["models"]["qwen3_4b"]["dtype"] = "fp8"
    msg = str(pytest.raises(ConfigError, validate_config, bad).value)
    assert "evaluation.n" in msg and "models.qwen3_4b.dtype" in msg


def test_seed_mapping(paper):
    cfg = validate_config(paper)
    assert seed_names(cfg) == ["main", "1", "2"]
    assert sampling_seed(cfg, "main") is None
    assert sampling_seed(cfg, "2") == 2
    cfg["evaluation"]["main_seed"] = 0
    assert sampling_seed(cfg, "main") == 0


def test_snakemake_stops_before_any_job_on_bad_config(tmp_path):
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["models"]["qwen3_4b"]["dtype"] = "bf16"
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text(yaml.safe_dump(cfg))
    proc = run_snakemake(["-n", "--directory", str(tmp_path)], check=False)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "models.qwen3_4b.dtype" in out and "Traceback" not in out, out


def test_every_training_and_method_key_reaches_the_trainer(paper):
    """Each `training.*` key and each method key either becomes a TrainConfig field of the run or is
    used by name elsewhere (listed here with where): none is validated and then dropped."""
    from dataclasses import MISSING, fields

    from pwopsd.config import load_schema, training_config
    from pwopsd.training.loop import TrainConfig

    used_elsewhere = {"eval_step": "rule train/merge_adapter params (the evaluated adapter)",
                      "threads": "the train rule's threads (settings.training_threads)",
                      "effective_batch": "checked against models.*.train x gpus.train",
                      "models": "which models are trained (trained_models)",
                      "resume_across_code_changes": "workflow/scripts/train.py, from the config (switching it reruns nothing)",
                      "rollout_sync_dir": "workflow/scripts/train.py, from the config (a speed setting)",
                      "rollout_check": "the rollout engine's settings (rollout_engine.check)",
                      "rollout_max_model_len": "the rollout engine's settings (rollout_engine.max_model_len)",
                      "teacher_transition": "the trainer's teacher_transition, emitted only when false (tested below)"}
    schema = load_schema()
    cfg = validate_config(paper)
    run = training_config(cfg, "qwen3_4b", "pwopsd_moderate")
    assert set(run) <= {f.name for f in fields(TrainConfig)}  # the trainer accepts every key
    assert {"check", "max_model_len"} <= set(run["rollout_engine"])
    renamed = {"lora": ["lora_r", "lora_alpha", "lora_dropout", "lora_targets"], "seeds": ["seed"]}  # a run's own seed
    for key in schema["properties"]["training"]["properties"]:
        if key in used_elsewhere:
            continue
        for name in renamed.get(key, [key]):
            assert name in run, f"training.{key} does not reach the trainer"
    method = schema["properties"]["methods"]["additionalProperties"]["properties"]
    into = {"loss": "method", "params": "loss"}
    # label: display name in tables; schedule_from: the train rule's fitted-schedule input fills the loss
    # params; seeds: the method's runs, each with its own seed (tested below and in test_settings)
    assert set(method) - {"label", "schedule_from", "seeds", "teacher_prompt"} == set(into)
    assert training_config(cfg, "qwen3_4b", "pwopsd_fitted")["loss"] == {"reduction": "per_sequence"}  # no hand-picked w_min/tau/s
    assert all(into[k] in run for k in into)
    # every trainer setting comes from the config; teacher_prompt only for an ablation, teacher_transition
    # only when off (their defaults are the paper's, so the paper's run keys did not move)
    assert {f.name for f in fields(TrainConfig)} == set(run) | {"teacher_prompt", "teacher_transition"}
    assert [f.name for f in fields(TrainConfig) if f.default is not MISSING] == ["teacher_prompt", "teacher_transition"]
    ablation = validate_config({**paper, "methods": {**paper["methods"], "x": {"loss": "opsd", "teacher_prompt": "student"}}})
    assert training_config(ablation, "qwen3_4b", "x")["teacher_prompt"] == "student"
    plain = validate_config({**paper, "training": {**paper["training"], "teacher_transition": False}})
    assert training_config(plain, "qwen3_4b", "opsd")["teacher_transition"] is False
    assert "teacher_transition" not in training_config(cfg, "qwen3_4b", "opsd")
    assert all(f.default_factory is MISSING for f in fields(TrainConfig))  # no second default
    tweaked = copy.deepcopy(cfg)
    tweaked["training"].update(chunk_size=7, rollout_batch_size=9)
    tweaked["methods"]["reopold"]["params"]["t_switch"] = 3
    got = training_config(tweaked, "qwen3_4b", "pwopsd_moderate")
    assert (got["chunk_size"], got["rollout_batch_size"]) == (7, 9)
    assert training_config(tweaked, "qwen3_4b", "reopold")["loss"] == {"lam": 0.1, "beta": 0.2, "t_switch": 3}


def test_loss_functions_take_every_setting_from_the_config():
    """The losses' parameters have no defaults in code: the schema's are the only ones, and each
    loss's declared parameters are exactly the keywords its functions take."""
    import inspect

    from pwopsd.training import chunked as C
    from pwopsd.training import losses as L
    from pwopsd.config import load_schema, schema_defaults
    from pwopsd.training.registry import loss_keywords

    for loss, ref, chunked in (("opsd", L.opsd_loss, C.opsd_loss_chunked), ("pwopsd", L.pwopsd_loss, C.pwopsd_loss_chunked),
                               ("eopd", L.eopd_loss, C.eopd_loss_chunked), ("reopold", L.reopold_loss, C.reopold_loss_chunked)):
        declared = set(schema_defaults("methods", {"loss": loss})["params"])
        for fn in (ref, chunked):
            kwonly = {n: p for n, p in inspect.signature(fn).parameters.items() if p.kind is p.KEYWORD_ONLY}
            assert declared <= set(kwonly), (fn.__name__, declared - set(kwonly))
            defaulted = {n for n, p in kwonly.items() if p.default is not p.empty}
            assert defaulted <= {"upcast"}, (fn.__name__, defaulted)  # fp32 math of the reference forms, not a setting
        assert set(loss_keywords(loss)) >= declared | {"temperature"}
    schema_losses = load_schema()["properties"]["methods"]["additionalProperties"]["properties"]["loss"]["enum"]
    assert set(schema_losses) == set(C.LOSSES)  # every configurable loss has a training-path entry, and back
    with pytest.raises(ConfigError, match="loss pwopsd: unknown parameter.*wmin"):
        loss_keywords("pwopsd", wmin=0.3)


def test_a_duplicated_yaml_key_is_rejected_with_its_lines(tmp_path):
    text = (REPO / "config" / "config.yaml").read_text()
    entry = text[text.index("  qwen3_4b:"):text.index("  dsr1_llama_8b:")]
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text(text.replace("  dsr1_llama_8b:", entry + "  dsr1_llama_8b:", 1))
    proc = run_snakemake(["-n", "--directory", str(tmp_path)], check=False)
    out = proc.stdout + proc.stderr
    first = text[: text.index("  qwen3_4b:")].count("\n") + 1
    second = text[: text.index("  dsr1_llama_8b:")].count("\n") + 1  # where the copy was inserted
    assert proc.returncode != 0, out[-2000:]
    assert f"line {second}: duplicate key 'qwen3_4b' (first given at line {first})" in out, out[-2000:]
    assert "Traceback" not in out
    from pwopsd.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="duplicate key 'qwen3_4b'"):
        load_config(tmp_path / "config" / "config.yaml")


def test_a_method_without_params_gets_its_loss_defaults(paper):
    cfg = copy.deepcopy(paper)
    cfg["methods"]["eopd_plain"] = {"loss": "eopd"}
    cfg["methods"]["reopold_plain"] = {"loss": "reopold"}
    got = validate_config(cfg)["methods"]
    assert got["eopd_plain"]["params"] == {"entropy_threshold": 0.8, "top_k": 16, "ppo_eps": 0.2}
    assert got["reopold_plain"]["params"] == {"lam": 0.1, "beta": 0.2, "t_switch": 50}


def test_tiny_mode_through_vllm_needs_the_cpu_kv_cache_setting():
    """vLLM on CPU (gpus.generate 0) is allowed; without kv_cache_memory_gib it would size its KV
    cache as 0.9 of the CPU memory and fail at start, so the config check names the key first."""
    import yaml

    tiny = yaml.safe_load((REPO / "tiny" / "config" / "config.yaml").read_text())
    overlay = yaml.safe_load((REPO / "tiny" / "config" / "vllm.yaml").read_text())
    merged = copy.deepcopy(tiny)
    merged["evaluation"].update(overlay["evaluation"])
    merged["models"]["tiny_qwen3"]["vllm"] = overlay["models"]["tiny_qwen3"]["vllm"]
    cfg = validate_config(merged)
    assert cfg["evaluation"]["backend"] == "vllm" and cfg["models"]["tiny_qwen3"]["vllm"]["in_process"] is True
    del merged["models"]["tiny_qwen3"]["vllm"]["kv_cache_memory_gib"]
    with pytest.raises(ConfigError, match=r"models\.tiny_qwen3\.vllm\.kv_cache_memory_gib: needed with evaluation.backend 'vllm' on CPU"):
        validate_config(merged)


def test_mc_dropout_over_more_layers_than_the_tiny_model_has_is_named_before_any_job():
    """The diagnostic's MC dropout perturbs the last ``last_layers`` blocks; a tiny model with fewer
    would fail only at the mc_dropout job, after the build and the teacher pass."""
    tiny = yaml.safe_load((REPO / "tiny" / "config" / "config.yaml").read_text())
    layers = tiny["tiny"]["num_hidden_layers"]
    tiny.setdefault("diagnostic", {})["mc_dropout"] = {"last_layers": layers}
    validate_config(copy.deepcopy(tiny))
    tiny["diagnostic"]["mc_dropout"]["last_layers"] = layers + 1
    with pytest.raises(ConfigError, match=rf"diagnostic\.mc_dropout\.last_layers: {layers + 1} but the tiny model has "
                                          rf"tiny\.num_hidden_layers {layers}"):
        validate_config(tiny)


def test_the_paper_trains_with_a_colocated_vllm_rollout_engine_per_model_memory_fraction():
    from pwopsd.config import training_config

    cfg = load_config(REPO / "config" / "config.yaml")
    fractions = {m: training_config(cfg, m, "opsd")["rollout_engine"]["gpu_memory_utilization"] for m in PAPER_MODELS}
    assert fractions == {"qwen3_4b": 0.4, "dsr1_llama_8b": 0.30, "olmo3_7b_think": 0.55}
    assert training_config(cfg, "qwen3_4b", "opsd")["rollout_backend"] == "vllm"
    tiny = load_config(REPO / "tiny" / "config" / "config.yaml")
    assert training_config(tiny, "tiny_qwen3", "opsd")["rollout_backend"] == "hf"
    assert training_config(tiny, "tiny_qwen3", "opsd")["rollout_engine"] == {}  # hf: nothing of vLLM in the run key


# ---------------------------------------------------------------------------------------------
# `--config` overrides: Snakemake hands nested command-line values over as strings (YAML's base
# loader); they are typed by the schema at their key before validation.


def _command_line(value):
    """A value as Snakemake's `--config` parsing hands a nested leaf over: a string (lists of strings)."""
    return yaml.load(yaml.safe_dump(value, default_flow_style=True), Loader=yaml.BaseLoader)


def _leaves(node, path=()):
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from _leaves(value, path + (key,))
    else:
        yield path, node


def _nest(path, value):
    for key in reversed(path):
        value = {key: value}
    return value


@pytest.mark.parametrize("name", ["config/config.yaml", "tiny/config/config.yaml"])
def test_every_key_given_on_the_command_line_gets_its_schema_type(name):
    """Each leaf of a shipped config (defaults filled), typed back from its command-line string,
    is the config's own value: integers, numbers, booleans, null, lists and strings, under
    models.<name>, the sources' kinds and each method's loss branch."""
    from pwopsd.config import load_schema, merge_configs, typed_overrides

    schema = load_schema()
    cfg = load_config(REPO / name)
    leaves = [(p, v) for p, v in _leaves(cfg) if p]
    kinds = {type(v).__name__ for _, v in leaves} | {type(x).__name__ for _, v in leaves if isinstance(v, list) for x in v}
    assert {"int", "float", "bool", "str", "list", "NoneType"} <= kinds, kinds
    for path, value in leaves:
        given = _nest(path, _command_line(value))
        typed = typed_overrides(merge_configs(cfg, given), given, schema)
        assert typed == _nest(path, value), (path, value, typed)


def test_command_line_values_typed_or_rejected_naming_the_key(paper):
    from pwopsd.config import merge_configs, typed_overrides

    def typed(overrides):
        return typed_overrides(merge_configs(paper, overrides), overrides)

    assert typed({"evaluation": {"n": "3", "seeds": ["main", "1"], "main_seed": "null", "temperature": "1"}}) == {
        "evaluation": {"n": 3, "seeds": ["main", 1], "main_seed": None, "temperature": 1}}
    # YAML 1.1 reads 5e-6 as a string; the schema's number type reads it as a number
    assert typed({"training": {"lr": "5e-6"}}) == {"training": {"lr": 5e-6}}
    # the loss branch of the method (from the config files) types its parameters
    assert typed({"methods": {"pwopsd_moderate": {"params": {"w_min": "0.5", "reduction": "global"}}}}) == {
        "methods": {"pwopsd_moderate": {"params": {"w_min": 0.5, "reduction": "global"}}}}
    # a string the schema accepts stays a string (a revision that looks like a number)
    assert typed({"models": {"qwen3_4b": {"revision": "1234"}}})["models"]["qwen3_4b"]["revision"] == "1234"
    # the right type out of range, and a value of no allowed type: validation names the key
    for overrides, words in ((({"evaluation": {"n": "0"}}), "evaluation.n: 0 is less than the minimum of 1"),
                             ({"evaluation": {"n": "three"}}, "evaluation.n: 'three' is not of type 'integer'")):
        with pytest.raises(ConfigError, match=words):
            validate_config(merge_configs(paper, typed(overrides)))


def test_snakemake_command_line_overrides_are_typed(tmp_path):
    """Through the real Snakemake CLI: a nested override plans with the typed value; one of no
    allowed type stops before any job naming the key."""
    base = ["-n", "--directory", str(REPO)]
    ok = run_snakemake(base + ["--config", "evaluation={n: 3, seeds: [main, 1]}", "training={lr: 1e-5}"], check=False)
    out = ok.stdout + ok.stderr
    assert ok.returncode == 0, out
    assert "config overrides (--config): evaluation.n = 3; evaluation.seeds = ['main', 1]; training.lr = 1e-05" in out
    bad = run_snakemake(base + ["--config", "evaluation={n: three}"], check=False)
    out = bad.stdout + bad.stderr
    assert bad.returncode != 0 and "evaluation.n: 'three' is not of type 'integer'" in out and "Traceback" not in out, out


def test_null_on_the_command_line_removes_an_entry_as_in_an_overlay_file(paper):
    """``--config 'benchmarks={hmmt_feb2025: null}'`` removes the benchmark, as null does in an
    overlay file (config/README.md); it reached the schema as the string 'null' and stopped the run."""
    from pwopsd.config import merge_configs, typed_overrides

    given = {"benchmarks": {"hmmt_feb2025": "null"}, "models": {"olmo3_7b_think": "~"}}
    typed = typed_overrides(merge_configs(paper, given), given)
    assert typed == {"benchmarks": {"hmmt_feb2025": None}, "models": {"olmo3_7b_think": None}}
    cfg = validate_config(merge_configs(paper, typed))
    assert "hmmt_feb2025" not in cfg["benchmarks"] and "olmo3_7b_think" not in cfg["models"]
    assert typed_overrides(paper, {"evaluation": {"backend": "null"}}) == {"evaluation": {"backend": "null"}}  # elsewhere: the schema's


def test_the_config_package_imports_nothing_above_it():
    """pwopsd.config is read by every other part of the package; it imports none of them (the loss
    registry reads the schema's defaults from here, not the other way round)."""
    import ast
    from pathlib import Path

    import pwopsd.config

    for path in Path(pwopsd.config.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            upward = [n for n in names if n.startswith("pwopsd") and not n.startswith("pwopsd.config")]
            assert not upward, f"{path.name} imports {upward}"


# -- overlays (config/smoke.yaml, config/rehearsal.yaml) --


def test_an_overlay_removes_entries_with_null_and_moves_a_source_to_another_kind(paper):
    """config/rehearsal.yaml leaves the paper's models and three benchmarks out (``null``) and
    points MATH-500 at a local file: merged key by key as Snakemake merges, the Hub source's
    ``dataset``/``revision`` would stay beside ``kind: local`` (an error naming them), and a null
    entry would be a schema error; both are what an overlay means now."""
    from pwopsd.config import load_config_files, merge_configs

    overlay = {"benchmarks": {"aime2024": None, "math500": {"source": {"kind": "local", "path": "m.jsonl"}}}}
    merged = merge_configs(paper, overlay)
    assert merged["benchmarks"]["math500"]["source"] == {"kind": "local", "path": "m.jsonl"}
    same_kind = merge_configs(paper, {"benchmarks": {"math500": {"source": {"split": "train"}}}})
    assert same_kind["benchmarks"]["math500"]["source"]["dataset"] == "HuggingFaceH4/MATH-500"  # merged, not replaced
    cfg = validate_config(merge_configs(merged, {"diagnostic": {"datasets": {"aime2024": None}},
                                                 "tables": {"ablation": {"benchmark": "aime2025"}}}))
    assert "aime2024" not in cfg["benchmarks"] and "aime2024" not in cfg["diagnostic"]["datasets"]
    rehearsal = load_config_files([REPO / "config" / "config.yaml", REPO / "config" / "rehearsal.yaml"])
    assert "smollm2_135m" in rehearsal["models"] and not set(PAPER_MODELS) & set(rehearsal["models"])
    assert list(rehearsal["benchmarks"]) == ["math500", "arith_oneshot"]
    # every paper setting the rehearsal keeps, as the paper sets it
    assert rehearsal["models"]["smollm2_135m"]["dtype"] == "bfloat16"
    assert (rehearsal["training"]["rollout_backend"], rehearsal["training"]["rollout_policy"]) == ("vllm", "merged_bf16")
    assert rehearsal["evaluation"]["backend"] == "vllm" and rehearsal["hub"]["offline"] is True
    for key in ("lr", "grad_clip", "lora", "temperature", "clip", "position_ids", "opsd_upcast", "rollout_top_k"):
        assert rehearsal["training"][key] == load_config(REPO / "config" / "config.yaml")["training"][key], key


def test_snakemake_reads_overlays_in_its_own_order_and_a_source_of_another_kind_replaces_the_old(tmp_path):
    """The workflow merges the config files itself (Snakefile's configfile first, then each
    --configfile): a dry run with an overlay moving MATH-500 to a local file plans, naming the file."""
    import shutil

    (tmp_path / "config").mkdir()
    shutil.copy(REPO / "config" / "config.yaml", tmp_path / "config" / "config.yaml")
    (tmp_path / "m.jsonl").write_text("")
    (tmp_path / "local.yaml").write_text(yaml.safe_dump({"benchmarks": {"math500": {"source": {"kind": "local", "path": "m.jsonl"}}}}))
    proc = run_snakemake(["-n", "--directory", str(tmp_path), "results/data/benchmarks/math500.parquet", "--configfile",
                          str(tmp_path / "config" / "config.yaml"), str(tmp_path / "local.yaml")], check=False)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert "m.jsonl" in proc.stdout


def test_dotted_overrides_nest_and_type_a_benchmarks_settings():
    """A benchmark's --set KEY.PATH=VALUE pairs: nested, typed by the schema as --config values."""
    from pwopsd.config import load_config
    from pwopsd.config.overrides import dotted_overrides

    cfg = load_config(REPO / "tiny" / "config" / "config.yaml")
    assert dotted_overrides(["training.lr=3e-3", "tiny.steps=100", "training.seeds=[1, 2]"], cfg) == {
        "training": {"lr": 0.003, "seeds": [1, 2]}, "tiny": {"steps": 100}}
    with pytest.raises(ValueError, match="expected KEY.PATH=VALUE"):
        dotted_overrides(["training.lr"], cfg)


def test_a_model_added_to_the_paper_config_stays_out_of_the_rehearsal_and_the_learning_run(paper, tmp_path):
    """A model is added by an entry in config/config.yaml alone (docs/extending.md): the CPU overlays
    name what they run (SmolLM2), so the new entry is neither trained, evaluated, diagnosed nor shown
    there (it stopped both overlays with its batch of 32 against their effective batch of 2)."""
    from pwopsd.config import load_config_files
    from pwopsd.config.design import table_methods, trained_models

    added = copy.deepcopy(paper)
    added["models"]["qwen3_1_7b"] = {**copy.deepcopy(paper["models"]["qwen3_4b"]), "hf_id": "Qwen/Qwen3-1.7B",
                                     "revision": "0123456789abcdef0123456789abcdef01234567", "size_b": 1.7}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(added, sort_keys=False))
    assert "qwen3_1_7b" in trained_models(validate_config(copy.deepcopy(added)))  # the paper trains it
    for overlays in (["rehearsal.yaml"], ["rehearsal.yaml", "learning.yaml"]):
        cfg = load_config_files([tmp_path / "config.yaml", *(REPO / "config" / n for n in overlays)])
        shown = {model for rows in table_methods(cfg).values() for model, _ in rows}
        assert trained_models(cfg) == ["smollm2_135m"] and shown == {"smollm2_135m"}, overlays
        assert cfg["evaluation"]["models"] == cfg["diagnostic"]["models"] == ["smollm2_135m"], overlays


def test_the_learning_overlay_trains_apart_from_its_evaluation_and_has_both_controls():
    """config/learning.yaml (issue 53) over the paper config and the rehearsal: SmolLM2 only, its
    corpus holds out the evaluation's problems and quotes its solutions in the model's own layout, the
    two broken teachers are runs of their own, and Table 2's layout lists them beside OPSD and PW-OPSD
    Moderate."""
    from pwopsd.config import load_config_files
    from pwopsd.config.design import method_runs

    cfg = load_config_files([REPO / "config" / n for n in ("config.yaml", "rehearsal.yaml", "learning.yaml")])
    assert "smollm2_135m" in cfg["models"] and not set(PAPER_MODELS) & set(cfg["models"])
    assert list(cfg["benchmarks"]) == ["arith_oneshot"]
    bench = cfg["benchmarks"]["arith_oneshot"]["source"]
    held = cfg["train_corpus"]["source"]["held_out"]
    assert [{k: h[k] for k in ("n", "levels", "seed")} for h in held] == [{k: bench[k] for k in ("n", "levels", "seed")}]
    assert (cfg["methods"]["opsd_no_solution"]["teacher_prompt"], cfg["methods"]["opsd_teacher_student"]["teacher_prompt"]) \
        == ("no_solution", "student")
    assert cfg["tables"]["main"]["methods"] == ["opsd", "pwopsd_moderate", "opsd_no_solution", "opsd_teacher_student"]
    assert all(method_runs(cfg, m) for m in cfg["tables"]["main"]["methods"])
    assert (cfg["training"]["rollout_backend"], cfg["training"]["rollout_policy"]) == ("vllm", "merged_bf16")
    # the teacher quotes the solution in the model's own numbered layout (docs/rehearsal.md)
    from pwopsd.data import load_tiny
    corpus, _ = load_tiny(cfg["train_corpus"]["source"])
    assert all(s.startswith("1. ") and "\n\nSo, the answer is \\boxed{" in s for s in corpus["solution"])
    # the privileged template without its transition paragraph, for every run, controls included
    from pwopsd.config import training_config
    assert all(training_config(cfg, "smollm2_135m", r)["teacher_transition"] is False for r in cfg["tables"]["main"]["methods"])
