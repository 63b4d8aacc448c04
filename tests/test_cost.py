"""Cost plan: per-job estimates from the token budgets against hand computations, and the plan
for the paper configuration counts Snakemake's own jobs."""

import re

import pytest

from conftest import REPO
from pwopsd import cost
from pwopsd.config import load_config


@pytest.fixture(scope="module")
def paper():
    return load_config(REPO / "config" / "config.yaml")


def test_generation_job_hours_by_hand(paper):
    a = cost.ASSUMPTIONS
    job = cost.Job("generate", {"model": "dsr1_llama_8b", "checkpoint": "base", "seed": "1"}, 4)
    tokens = (500 + 30 + 30 + 30) * 12 * 38912 * a["eval_length_fraction"]
    rate = a["decode_tok_s_per_gpu_4b"] * 4 / 8 * 4  # 8B model on 4 GPUs
    expected = a["startup_min"] / 60 + tokens / rate / 3600
    assert cost.job_hours(job, paper) == pytest.approx(expected)
    # The longest sample bounds a job from below: a tiny token budget is tail-dominated.
    few = {**paper, "benchmarks": {"aime2024": paper["benchmarks"]["aime2024"]},
           "evaluation": {**paper["evaluation"], "n": 1}}
    tail = 38912 / (a["stream_tok_s_4b"] * 4 / 8)
    assert cost.job_hours(job, few) == pytest.approx(a["startup_min"] / 60 + tail / 3600)


def test_model_size_from_entry_or_hub_id(paper):
    assert [cost.model_size_b(paper, m) for m in paper["models"]] == [4.0, 8.0, 7.0]
    cfg = {"models": {"x": {"hf_id": "org/model"}}}
    with pytest.raises(SystemExit, match="models.x: set size_b"):
        cost.model_size_b(cfg, "x")
    assert cost.model_size_b({"models": {"x": {"hf_id": "org/model", "size_b": 1.5}}}, "x") == 1.5


def test_cpu_jobs_cost_no_gpu_hours(paper):
    rows = cost.plan([cost.Job("grade", {"model": "qwen3_4b"}, 0), cost.Job("table", {}, 0)], paper)
    assert all(r["gpu_hours"] == 0 for r in rows) and sum(r["jobs"] for r in rows) == 2


def test_paper_plan_counts_the_dry_run_jobs(paper, capsys):
    jobs = cost.dry_run_jobs(str(REPO), ["results/tables/main_4b.tex"], forceall=True)
    rows = {r["rule"]: r for r in cost.plan(jobs, paper)}
    assert rows["generate"]["jobs"] == 15 and rows["train"]["jobs"] == 5 and rows["grade"]["gpu_hours"] == 0
    per_train = cost.job_hours(cost.Job("train", {"model": "qwen3_4b", "method": "opsd"}, 4), paper)
    assert rows["train"]["gpu_hours"] == pytest.approx(5 * 4 * per_train)
    cost.main(["--directory", str(REPO), "--all", "--assume", "eval_length_fraction=0.5", "results/tables/main_4b.tex"])
    out = capsys.readouterr().out
    assert "eval_length_fraction=0.5" in out and out.splitlines()[1].startswith("generate")


def test_every_gpu_rule_of_the_paper_dag_has_a_cost_model(paper):
    """A rule that asks for GPUs needs an estimate: the paper DAG's GPU jobs all have one, and a
    GPU job of an unknown rule is an error rather than a silent zero."""
    jobs = cost.dry_run_jobs(str(REPO), ["all", "train_all"], forceall=True)
    gpu_rules = {j.rule for j in jobs if j.gpus}
    # generate_sweep_step exists only with seeds_per_job: all and evaluation.sweep_seeds (priced below)
    assert gpu_rules == set(cost.GPU_HOURS) - {"generate_sweep_step"}, gpu_rules ^ set(cost.GPU_HOURS)
    assert all(cost.job_hours(j, paper) > 0 for j in jobs if j.gpus)
    with pytest.raises(ValueError, match="rule new_phase asks for 1 GPUs but has no cost model"):
        cost.job_hours(cost.Job("new_phase", {"model": "qwen3_4b"}, 1), paper)


def test_one_engine_per_gpu_is_priced_beside_the_configured_tensor_parallel_layout(paper, capsys):
    """The paper's TP=4 engines vs one engine per GPU (DP=4): per-GPU throughput x decode_gain_tp1,
    single-stream speed x stream_gain_tp1, by hand; the plan prints both."""
    a = cost.ASSUMPTIONS
    dp = cost.data_parallel_layout(paper)
    assert {m: (e["vllm"]["tensor_parallel_size"], e["vllm"]["data_parallel_size"]) for m, e in dp["models"].items()} == {
        m: (1, 4) for m in paper["models"]}
    assert paper["models"]["qwen3_4b"]["vllm"]["tensor_parallel_size"] == 4  # the config itself is left alone
    job = cost.Job("generate", {"model": "qwen3_4b", "checkpoint": "base", "seed": "1"}, 4)
    tokens = 590 * 12 * 38912 * a["eval_length_fraction"]
    expected = a["startup_min"] / 60 + tokens / (a["decode_tok_s_per_gpu_4b"] * 4 * a["decode_gain_tp1"]) / 3600
    assert cost.job_hours(job, dp) == pytest.approx(expected)
    few = {**dp, "benchmarks": {"aime2024": dp["benchmarks"]["aime2024"]}, "evaluation": {**dp["evaluation"], "n": 1}}
    tail = 38912 / (a["stream_tok_s_4b"] * a["stream_gain_tp1"])  # one stream on one GPU is slower
    assert cost.job_hours(job, few) == pytest.approx(a["startup_min"] / 60 + tail / 3600)
    cost.main(["--directory", str(REPO), "--all", "results/tables/main_4b.tex"])
    out = capsys.readouterr().out
    assert "vLLM layout as configured (qwen3_4b TP=4 x DP=1" in out and "with one engine per GPU instead" in out


def test_training_rollouts_are_priced_by_the_configured_rollout_backend(paper):
    """vLLM: one engine per training GPU (TP=1 throughput); hf: transformers decoding on the PEFT
    model, by hand from the assumptions."""
    import copy

    a = cost.ASSUMPTIONS
    job = cost.Job("train", {"model": "qwen3_4b", "method": "opsd"}, 4)
    prices = {}
    for backend, policy in (("vllm", "adapter"), ("vllm", "merged_bf16"), ("hf", "adapter")):
        cfg = copy.deepcopy(paper)
        cfg["training"].update(rollout_backend=backend, rollout_policy=policy)
        prices[backend if policy == "adapter" else policy] = cost.job_hours(job, cfg)
    tokens, longest = 32 * 1024, 1024
    fwd = 6.0 * 32 * (a["train_prompt_tokens"] + 1024) / (a["forward_tok_s_per_gpu_4b"] * 4)
    vllm_decode = max(tokens / (a["decode_tok_s_per_gpu_4b"] * 4 * a["decode_gain_tp1"]),
                      longest / (a["stream_tok_s_4b"] * a["stream_gain_tp1"]))
    hf_decode = max(tokens / (a["hf_rollout_tok_s_per_gpu_4b"] * 4), longest / a["hf_stream_tok_s_4b"])
    merged = vllm_decode + a["merged_sync_s_per_b_params"] * 4  # 4B weights written and reloaded every step
    for backend, decode in (("vllm", vllm_decode), ("merged_bf16", merged), ("hf", hf_decode)):
        expected = a["startup_min"] / 60 + 150 * (decode + fwd + a["train_step_overhead_s"]) / 3600
        assert prices[backend] == pytest.approx(expected), backend
    assert prices["hf"] > prices["vllm"]


def test_the_cost_plan_prices_an_overlay_config(capsys):
    """config/seeds.yaml: Table 2's five methods with three training seeds each, priced as run."""
    cost.main(["--directory", str(REPO), "--configfile", "config/seeds.yaml", "results/tables/main_4b.tex"])
    three = capsys.readouterr().out
    cost.main(["--directory", str(REPO), "results/tables/main_4b.tex"])
    one = capsys.readouterr().out
    jobs = {name: {m.group(1): int(m.group(2)) for m in re.finditer(r"^(train|generate)\s+(\d+)", out, re.M)}
            for name, out in (("three", three), ("one", one))}
    assert jobs == {"three": {"train": 15, "generate": 45}, "one": {"train": 5, "generate": 15}}


def test_attempts_under_the_partition_limit_by_hand(paper):
    """A job of h hours (start-up included) stopped at the limit resumes in the next attempt: each
    attempt does the limit less its start-up and the notice window of work."""
    from pwopsd.notice import NOTICE_GRACE_SECONDS

    a = cost.ASSUMPTIONS
    usable = 240 - a["startup_min"] - NOTICE_GRACE_SECONDS / 60  # a 4-hour partition
    assert cost.usable_minutes(240) == pytest.approx(usable)
    for hours in (0.5, 3.0, 12.0, 30.0):
        work = hours * 60 - a["startup_min"]
        expected = max(1, -(-work // usable))
        assert cost.attempts_needed(hours, 240) == expected, hours
    assert cost.attempts_needed(12.0, 2880) == 1
    job = cost.training_jobs(paper)[0]
    hours = cost.job_hours(job, paper)
    short = {**paper, "cluster": {"max_runtime_min": 60}}
    assert cost.train_retries(short) == max(cost.attempts_needed(cost.job_hours(j, short), 60)
                                            for j in cost.training_jobs(short)) - 1 + 2
    assert cost.train_retries(paper) == 2 and hours < 48  # the paper's runs fit one 48-hour attempt


def test_a_limit_too_short_for_one_step_is_refused_with_the_numbers(paper):
    """An attempt at cluster.max_runtime_min must hold the start-up, one step and the train rule's
    warning window (the profile's --signal=TERM@N, read here from the profile file itself)."""
    a = cost.ASSUMPTIONS
    window_min = int(re.search(r"TERM@(\d+)", _profile()["set-resources"]["train"]["slurm_extra"])[1]) / 60
    job = cost.training_jobs(paper)[0]
    step = cost.train_step_seconds(job, paper, cost.model_size_b(paper, "qwen3_4b"), a) / 60
    need = a["startup_min"] + step + window_min
    assert cost.cap_problems({**paper, "cluster": {"max_runtime_min": 30}}, rules={"train"}) == []
    problems = cost.cap_problems({**paper, "cluster": {"max_runtime_min": int(need) - 1}}, rules={"train"})
    assert len(problems) == len([j for j in cost.training_jobs(paper) if j.gpus])  # the 8B and 7B steps are longer
    assert f"cluster.max_runtime_min={int(need) - 1} is too short for training qwen3_4b/opsd" in problems[0]
    assert (f"{a['startup_min']:g} min start-up + {step:.1f} min for one training step + {window_min:g} min notice window "
            f"(set-resources.train.slurm_extra) = {need:.1f} min") in problems[0]
    # every kind that stops on notice is held to its own window: a generation shard and 40 minutes
    generate = cost.cap_problems({**paper, "cluster": {"max_runtime_min": 30}}, rules={"generate"})
    assert generate and all("is too short for generate jobs of" in p for p in generate)


def _profile():
    import yaml

    return yaml.safe_load((REPO / "profiles" / "slurm" / "profile.yaml").read_text())


def _attempt_limits_from_profile(rule, cap, attempts):
    """The limit (minutes) of attempts 1..attempts of a rule, evaluated from the profile's own text
    as Snakemake would (the cap substituted for the environment variable)."""
    expr = _profile()["set-resources"][rule]["runtime"].replace("$PWOPSD_MAX_RUNTIME_MIN", str(cap))
    return [eval(expr, {"__builtins__": {"min": min}}, {"attempt": k}) for k in range(1, attempts + 1)]


def _attempts_by_brute_force(hours, rule, cap, window_s, a):
    """Smallest K whose first K attempts (attempt k: its own limit) hold the job's work, each attempt
    losing its start-up and the warning window."""
    work = hours * 60 - a["startup_min"]
    limits = _attempt_limits_from_profile(rule, cap, 200)
    done = 0.0
    for k, limit in enumerate(limits, start=1):
        done += max(0.0, limit - a["startup_min"] - window_s / 60)
        if done >= work - 1e-9:
            return k
    return 0


def test_attempts_follow_the_profiles_growing_limits_not_the_cap(paper):
    """Attempt k gets min(base x k, cap) minutes (the profile's runtime expression), not the cap:
    a training run longer than its first attempt needs more attempts than a count at the cap says,
    and the train rule's retries are those attempts beyond the first plus 2 for failures."""
    import copy

    a = cost.ASSUMPTIONS
    window_s = int(re.search(r"TERM@(\d+)", _profile()["set-resources"]["train"]["slurm_extra"])[1])
    cap = 1000  # a partition limit between the first attempt's 720 minutes and the second's 1,440
    cfg = copy.deepcopy(paper)
    cfg["cluster"]["max_runtime_min"] = cap
    cfg["training"].update(rollout_backend="hf", rollout_policy="adapter", max_completion_length=2048)
    for steps in range(150, 2000, 25):  # the first run length at which the two counts differ
        cfg["training"]["max_steps"] = steps
        hours = max(cost.job_hours(j, cfg) for j in cost.training_jobs(cfg) if j.gpus)
        expected = _attempts_by_brute_force(hours, "train", cap, window_s, a)
        at_the_cap = -(-(hours * 60 - a["startup_min"]) // (cap - a["startup_min"] - window_s / 60))
        if expected > at_the_cap:
            break
    assert expected > at_the_cap >= 1, (expected, at_the_cap)  # the case tells the two counts apart
    assert cost.train_retries(cfg) == expected - 1 + 2
    limits = cost.attempt_limits(_profile()["set-resources"]["train"]["runtime"], cap)
    assert limits == _attempt_limits_from_profile("train", cap, len(limits)) and limits[-1] == cap
    for h in (1.0, 11.0, 13.0, 20.0, 30.0, 60.0):
        assert cost.attempts_needed(h, limits, window_s=window_s) == _attempts_by_brute_force(h, "train", cap, window_s, a), h
    # the cost plan's rows count the same way, per rule with the rule's own base and window
    job = cost.Job("train", {"model": "qwen3_4b", "method": "opsd"}, 4)
    row = cost.plan([job], cfg)[0]
    assert row["attempts"] == _attempts_by_brute_force(cost.job_hours(job, cfg), "train", cap, window_s, a)


def test_a_job_that_does_not_resume_must_fit_one_attempt(paper):
    """teacher_pass keeps nothing when it is stopped: it needs the first attempt long enough for all of it."""
    limits = [90, 180, 270]
    assert cost.attempts_needed(2.0, limits, resumes=False) == 2  # 120 minutes: the second attempt's 180
    assert cost.attempts_needed(5.0, limits, resumes=False) == 0  # never
    assert cost.attempts_needed(5.0, limits) > 1  # a resuming job gets there


def test_notice_windows_by_hand(paper):
    """The window each kind of job needs after its warning, from the assumptions by hand: the piece
    in progress (x notice_safety), saving it, and shutting its vLLM engines down."""
    a = cost.ASSUMPTIONS
    need = {(w.rule, w.job): w.seconds for rule in cost.NOTICE_KINDS for w in cost.notice_work(rule, paper)}
    # generation: 100 problems x 12 samples of the 8B model on one TP=4 engine (4 GPUs)
    shard = 100 * 12 * 38912 * a["eval_length_fraction"]
    decode = max(shard / (a["decode_tok_s_per_gpu_4b"] * 4 / 8 * 4), 38912 / (a["stream_tok_s_4b"] * 4 / 8))
    assert need["generate", "dsr1_llama_8b"] == pytest.approx(a["notice_safety"] * decode + a["engine_shutdown_s"])
    # grading: MATH-500's 500 problems x 12, two graders, four workers, Maj@12 over half as many distinct answers
    per_grader = 500 * 12 * a["grade_s"] / 4 + 500 * min(120, 6 ** 2 * a["grade_s"] / 4)
    assert need["grade", "the largest benchmark"] == pytest.approx(a["notice_safety"] * 2 * per_grader)
    # training: one step, its checkpoint, one colocated engine per rank (stopped side by side)
    step = cost.train_step_seconds(cost.Job("train", {"model": "qwen3_4b", "method": "opsd"}, 4), paper, 4.0, a)
    assert need["train", "qwen3_4b/opsd"] == pytest.approx(a["notice_safety"] * (step + a["checkpoint_s"])
                                                          + a["engine_shutdown_s"])
    # diagnostic shards of Qwen3-4B: 50 greedy spines; 100 forced requests x 6 rollouts
    spines = max(50 * 16384 * a["spine_length_fraction"] / (a["decode_tok_s_per_gpu_4b"] * 4), 16384 / a["stream_tok_s_4b"])
    assert need["spines", "qwen3_4b"] == pytest.approx(a["notice_safety"] * spines + a["engine_shutdown_s"])
    forced = max(600 * 32768 * a["forced_length_fraction"] / (a["decode_tok_s_per_gpu_4b"] * 4),
                 (32768 - 16384 * a["spine_length_fraction"]) / a["stream_tok_s_4b"])
    assert need["forced_continuation", "qwen3_4b"] == pytest.approx(a["notice_safety"] * forced + a["engine_shutdown_s"])
    # a cap on the continuations' new tokens (diagnostic.forced_continuation.max_new_tokens) is priced:
    # 600 rollouts of at most 64 tokens, the longest 64
    capped = {**paper, "diagnostic": {**paper["diagnostic"], "forced_continuation": {
        **paper["diagnostic"]["forced_continuation"], "max_new_tokens": 64}}}
    short = max(600 * 64 / (a["decode_tok_s_per_gpu_4b"] * 4), 64 / a["stream_tok_s_4b"])
    assert cost.notice_work("forced_continuation", capped)[0].piece_s == pytest.approx(short)
    # one engine per GPU instead: four engines, stopped one after the other
    dp = cost.data_parallel_layout(paper)
    assert cost.notice_work("generate", dp)[0].shutdown_s == 4 * a["engine_shutdown_s"]


def test_window_pieces_are_the_pieces_the_jobs_save():
    """The shard sizes priced are the defaults of the functions that shard the work, and no job
    script passes another."""
    import inspect

    from pwopsd.generation.sampling import generate_resumable

    for script in (REPO / "workflow" / "scripts").glob("*.py"):
        assert "shard_size" not in script.read_text(), script.name
    sizes = cost.shard_sizes()
    assert sizes["forced_continuation"] == inspect.signature(generate_resumable).parameters["shard_size"].default

    class Recording:  # a backend that records how many requests each call gets
        calls = []

        def generate(self, requests):
            self.calls.append(len(requests))
            return [[] for _ in requests]

    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        backend = Recording()
        generate_resumable(backend, [object()] * (sizes["forced_continuation"] + 3), [{}] * (sizes["forced_continuation"] + 3),
                           partial=Path(tmp) / "p")
    assert backend.calls == [sizes["forced_continuation"], 3]


def test_a_generate_job_that_samples_every_seed_costs_them_all(paper):
    """evaluation.seeds_per_job: all (no seed wildcard): the job decodes every seed of its checkpoint;
    a swept step's checkpoint only evaluation.sweep_seeds (rule generate_sweep_step)."""
    per_seed = cost.job_hours(cost.Job("generate", {"model": "qwen3_4b", "checkpoint": "opsd", "seed": "1"}, 4), paper)
    startup = cost.ASSUMPTIONS["startup_min"] / 60
    every = cost.job_hours(cost.Job("generate", {"model": "qwen3_4b", "checkpoint": "opsd"}, 4), paper)
    assert every - startup == pytest.approx(3 * (per_seed - startup))
    swept = {**paper, "evaluation": {**paper["evaluation"], "sweep_seeds": [1]}}
    step = cost.job_hours(cost.Job("generate_sweep_step", {"model": "qwen3_4b", "checkpoint": "opsd-step50"}, 4), swept)
    assert step == pytest.approx(per_seed)
