"""Time limits on a cluster: how many attempts a job needs when Slurm stops each at the profile's
runtime (a job that stops on notice resumes in the next one), and whether each rule's warning
window holds the work its jobs finish on notice (checked when the workflow starts)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pwopsd.cluster import WARNING_SIGNAL, Profile, RuleLimits, runtime_minutes
from pwopsd.config import training_config
from pwopsd.cost.hours import (
    ASSUMPTIONS,
    Job,
    _decode_hours,
    _diagnostic_sizes,
    _vllm_tp,
    assumptions,
    forced_lengths,
    job_hours,
    max_runtime,
    model_size_b,
    train_step_seconds,
    training_jobs,
)
from pwopsd.notice import NOTICE_GRACE_SECONDS

# ---------------------------------------------------------------------------------------------
# Attempts: Slurm stops each attempt at its time limit, which the profile writes as an expression of
# `attempt` (min(base * attempt, cap)); a job that stops on notice does its limit less its start-up
# and its warning window of work, and the next attempt resumes.


def attempt_limits(runtime, cap_min: float, most: int = 64) -> list[float]:
    """Minutes of attempts 1, 2, ... of a profile ``runtime`` (a number or an expression of
    ``attempt``) under ``cap_min``, up to the first that reaches the cap or stops growing: every
    later attempt gets the last one's limit."""
    if runtime is None:  # no runtime in the profile: the partition's limit
        return [cap_min]
    limits = []
    for attempt in range(1, most + 1):
        limits.append(min(runtime_minutes(runtime, attempt, cap_min), cap_min))
        if limits[-1] >= cap_min or (len(limits) > 1 and limits[-1] <= limits[-2]):
            break
    return limits


def usable_minutes(limit_min: float, a: dict = ASSUMPTIONS, window_s: float = NOTICE_GRACE_SECONDS) -> float:
    """Minutes of work an attempt limited to ``limit_min`` does: less its start-up and the warning
    window before the limit (``window_s``), in which it finishes its piece in progress and saves it."""
    return limit_min - a["startup_min"] - window_s / 60.0


def attempts_needed(hours: float, limits, a: dict = ASSUMPTIONS, window_s: float = NOTICE_GRACE_SECONDS,
                    resumes: bool = True) -> int:
    """Attempts (submissions) that a job of ``hours`` (start-up included) needs when attempt k is
    stopped at ``limits[k - 1]`` minutes (the last entry holds for every later attempt; a number:
    every attempt's limit). A job that ``resumes`` carries each attempt's work over (warned
    ``window_s`` before the limit); any other job must fit one attempt. 0: never."""
    limits = [float(limits)] if isinstance(limits, (int, float)) else [float(x) for x in limits]
    work = max(0.0, hours * 60.0 - a["startup_min"])
    done = 0.0
    for attempt, limit in enumerate(limits, start=1):
        if not resumes:
            if hours * 60.0 <= limit + 1e-9:
                return attempt
            continue
        done += max(0.0, usable_minutes(limit, a, window_s))
        if done >= work - 1e-9:
            return attempt
    usable = usable_minutes(limits[-1], a, window_s)
    if not resumes or usable <= 0:
        return 0  # never: cap_problems says why
    return len(limits) + max(1, math.ceil((work - done) / usable - 1e-9))


def warning_seconds(limits: RuleLimits) -> float:
    """Seconds of a rule's warning window (0: none: the job hears of its limit only when it is reached)."""
    return float(limits.warning.seconds) if limits.warning else 0.0


def rule_attempts(hours: float, rule: str, profile: Profile, cap_min: float, a: dict = ASSUMPTIONS) -> int:
    """Attempts a job of ``rule`` lasting ``hours`` needs under ``profile``'s limits for the rule."""
    limits = profile.limits(rule)
    try:
        per_attempt = attempt_limits(limits.runtime, cap_min)
    except ValueError as exc:
        raise ValueError(f"{profile.source}: {limits.runtime_key}: {exc}") from None
    return attempts_needed(hours, per_attempt, a, warning_seconds(limits), resumes=rule in NOTICE_KINDS)


def train_retries(cfg: dict, a: dict | None = None, failures: int = 2, profile: Profile | None = None) -> int:
    """The train rule's retries on a cluster: the attempts its longest run needs under the profile's
    limits for the rule (attempt k: ``min(base * k, cluster.max_runtime_min)``; each resumes from
    the checkpoint the previous one wrote on notice), beyond the first, plus ``failures`` for
    crashes, node failures and memory kills."""
    a = assumptions(cfg) if a is None else a
    profile = profile or Profile.from_file()
    cap = max_runtime(cfg)
    needed = [rule_attempts(job_hours(job, cfg, a), "train", profile, cap, a) for job in training_jobs(cfg) if job.gpus]
    return max(needed, default=1) - 1 + failures


# ---------------------------------------------------------------------------------------------
# Notice windows: a job of these rules stops on notice (pwopsd.notice): it finishes the piece in
# progress, saves it, shuts its engines down and exits 75; Slurm's warning (--signal=TERM@N in the
# rule's slurm_extra) must come early enough for that, or the piece is lost at the kill (SIGKILL
# KillWait, 30 s by default, after the limit's SIGTERM).

# Rule -> job kind; the kind decides the piece a job finishes after the warning.
NOTICE_KINDS = {"train": "train", "generate": "generate", "generate_sweep_step": "generate", "grade": "grade",
                "grade_sweep_step": "grade", "spines": "spines", "forced_continuation": "forced_continuation"}


def shard_sizes() -> dict[str, int]:
    """Requests a resumable job saves at once, read from the functions that shard them (the jobs use
    their defaults): a generation shard (problems of a benchmark), a spine shard, a forced-continuation
    shard ((candidate, child) requests)."""
    import inspect

    from pwopsd.diagnostic.phases import run_spines
    from pwopsd.generation.sampling import generate_resumable, sample_benchmark

    def default(fn):
        return int(inspect.signature(fn).parameters["shard_size"].default)

    return {"generate": default(sample_benchmark), "spines": default(run_spines),
            "forced_continuation": default(generate_resumable)}


@dataclass(frozen=True)
class NoticeWork:
    """What a job finishes after the warning: its piece in progress (``piece_s``), saving it
    (``save_s``), then its engines' shutdown (``shutdown_s``); :attr:`seconds` is the window it needs."""

    rule: str
    job: str       # which job: model, or model/run
    piece: str     # what the piece is
    piece_s: float
    save_s: float
    shutdown_s: float
    safety: float

    @property
    def seconds(self) -> float:
        return self.safety * (self.piece_s + self.save_s) + self.shutdown_s

    def explain(self) -> str:
        save = f" + {self.save_s:.0f} s to save it" if self.save_s else ""
        shutdown = f" + {self.shutdown_s:.0f} s engine shutdown" if self.shutdown_s else ""
        return (f"{self.piece} {self.piece_s:.0f} s{save}, x{self.safety:g} (notice_safety){shutdown} = "
                f"{self.ceil_seconds} s")

    @property
    def ceil_seconds(self) -> int:
        return math.ceil(self.seconds - 1e-6)


def _rows(bench: dict, unknown: float) -> float:
    """A benchmark's problems (``expected_rows``, a generated benchmark's ``source.n``, else
    ``unknown``; ``first_rows`` when a smoke run keeps fewer)."""
    rows = bench.get("expected_rows") or (bench.get("source") or {}).get("n") or unknown
    return min(rows, bench.get("first_rows") or math.inf)


def _engines(cfg: dict, model: str) -> int:
    """vLLM engines a generation job of ``model`` shuts down (0 with the hf backend)."""
    if cfg["evaluation"].get("backend") != "vllm":
        return 0
    return max(1, int(cfg["models"][model].get("vllm", {}).get("data_parallel_size", 1) or 1))


def generation_shard_seconds(job: Job, cfg: dict, size: float, a: dict, shard: int) -> tuple[float, str]:
    ev = cfg["evaluation"]
    problems = min(shard, max(_rows(b, shard) for b in cfg["benchmarks"].values()))
    tokens = problems * ev["n"] * ev["max_new_tokens"] * a["eval_length_fraction"]
    seconds = _decode_hours(tokens, ev["max_new_tokens"], size, job.gpus, a, tp=_vllm_tp(cfg, job)) * 3600.0
    return seconds, f"one generation shard ({problems:g} problems x {ev['n']} samples <= {ev['max_new_tokens']} tokens)"


def spine_shard_seconds(job: Job, cfg: dict, size: float, a: dict, shard: int) -> tuple[float, str]:
    d, problems, spine, _ = _diagnostic_sizes(job, cfg, size, a)
    n = min(shard, problems)
    seconds = _decode_hours(n * spine, d["spine"]["max_new_tokens"], size, job.gpus, a, tp=_vllm_tp(cfg, job)) * 3600.0
    return seconds, f"one spine shard ({n} spines <= {d['spine']['max_new_tokens']} tokens)"


def forced_shard_seconds(job: Job, cfg: dict, size: float, a: dict, shard: int) -> tuple[float, str]:
    d, problems, spine, _ = _diagnostic_sizes(job, cfg, size, a)
    fc = d["forced_continuation"]
    n = min(shard, problems * d["candidates"]["max_per_problem"] * d["candidates"]["children"])
    expected, longest = forced_lengths(fc, spine, a)
    seconds = _decode_hours(n * fc["n"] * expected, longest, size, job.gpus, a, tp=_vllm_tp(cfg, job)) * 3600.0
    return seconds, f"one forced-continuation shard ({n} requests x {fc['n']} rollouts)"


def grading_pair_seconds(cfg: dict, a: dict) -> tuple[float, str]:
    """One benchmark-seed pair of the largest benchmark, graded by every grader: a comparison per
    sample with its gold, and each problem's Maj@N clustering (every ordered pair of its distinct
    predictions, at most ``grading.maj_budget`` seconds a problem), on ``grading.workers`` workers."""
    ev, gr = cfg["evaluation"], cfg["grading"]
    problems = max(_rows(b, 0) for b in cfg["benchmarks"].values())
    workers, n, graders = int(gr["workers"]), int(ev["n"]), len(gr["graders"])
    distinct = max(1.0, a["maj_distinct_fraction"] * n)
    maj = min(float(gr["maj_budget"]), distinct ** 2 * a["grade_s"] / workers)
    seconds = graders * problems * (n * a["grade_s"] / workers + maj)
    return seconds, f"one grading pair ({problems:g} problems x {n} samples, {graders} graders, {workers} workers)"


def notice_work(rule: str, cfg: dict, a: dict | None = None) -> list[NoticeWork]:
    """What each job of ``rule`` (a key of :data:`NOTICE_KINDS`) finishes after the warning, one
    entry per model (training: per run); GPU jobs of a model with no GPUs or built by the workflow
    (the tiny CPU model: no H100 figures) are left out. A hub model with no size is an error
    (SystemExit, as in the cost plan)."""
    a = assumptions(cfg) if a is None else a
    from pwopsd.config import diagnostic_models, eval_models, training_runs

    kind = NOTICE_KINDS[rule]
    safety = a["notice_safety"]
    if kind == "grade":
        seconds, piece = grading_pair_seconds(cfg, a)
        return [NoticeWork(rule, "the largest benchmark", piece, seconds, 0.0, 0.0, safety)]
    if kind == "train":
        jobs = training_jobs(cfg)
    else:
        models = diagnostic_models(cfg) if kind in ("spines", "forced_continuation") else \
            list(dict.fromkeys([*eval_models(cfg), *(m for m, _ in training_runs(cfg))]))
        jobs = [Job(rule, {"model": m, "checkpoint": "base"}, int(cfg["models"][m]["gpus"]["generate"])) for m in models]
    out = []
    shard = None if kind == "train" else shard_sizes()[kind]
    for job in jobs:
        model = job.wildcards["model"]
        if job.gpus == 0 or "built_by" in cfg["models"][model]:
            continue
        size = model_size_b(cfg, model)
        if kind == "train":
            tr = training_config(cfg, model, job.wildcards["method"])
            engines = 1 if tr["rollout_backend"] == "vllm" else 0  # one per rank, stopped side by side
            out.append(NoticeWork(rule, f"{model}/{job.wildcards['method']}", "one training step",
                                  train_step_seconds(job, cfg, size, a), a["checkpoint_s"],
                                  engines * a["engine_shutdown_s"], safety))
            continue
        piece_of = {"generate": generation_shard_seconds, "spines": spine_shard_seconds,
                    "forced_continuation": forced_shard_seconds}[kind]
        seconds, piece = piece_of(job, cfg, size, a, shard)
        out.append(NoticeWork(rule, model, piece, seconds, 0.0, _engines(cfg, model) * a["engine_shutdown_s"], safety))
    return out


def needed_window(rule: str, cfg: dict, a: dict | None = None) -> NoticeWork | None:
    """The job of ``rule`` that needs the longest warning window (None: no job to price)."""
    a = assumptions(cfg) if a is None else a
    work = notice_work(rule, cfg, a)
    return max(work, key=lambda w: w.seconds) if work else None


def window_problems(cfg: dict, profile: Profile | None = None, rules=None, a: dict | None = None) -> list[str]:
    """Rules of :data:`NOTICE_KINDS` (those of ``rules`` when given: the rules the workflow has)
    whose warning cannot hold the work a job finishes on notice: none, not SIGTERM to the job step,
    or shorter than the longest job's need. One message per rule, naming the profile setting."""
    a = assumptions(cfg) if a is None else a
    profile = profile or Profile.from_file()
    problems = []
    for rule in NOTICE_KINDS:
        if rules is not None and rule not in rules:
            continue
        limits = profile.limits(rule)
        where = f"{profile.source}: {limits.slurm_extra_key}"
        try:
            need = needed_window(rule, cfg, a)
        except SystemExit as exc:  # a model with no size
            problems.append(f"{exc} (the notice window of rule {rule} is derived from it)")
            continue
        warning = limits.warning
        if warning is None:
            if need is not None:
                problems.append(f"{where} asks for no warning: a {rule} job stops on notice, but would hear of its "
                                f"time limit only at the limit, with Slurm's KillWait (30 s by default) left for "
                                f"{need.explain()}; add '--signal={WARNING_SIGNAL}@N' with N >= {need.ceil_seconds}")
            continue
        if warning.signal != WARNING_SIGNAL or warning.batch_only:
            problems.append(f"{where} asks for --signal={'B:' if warning.batch_only else ''}{warning.signal}@"
                            f"{warning.seconds}: the warning must be SIGTERM to the job step ('--signal="
                            f"{WARNING_SIGNAL}@N', no B:), the signal a job's Snakemake waits on and its script "
                            "stops on (docs/cluster.md)")
        elif need is not None and warning.seconds < need.ceil_seconds:
            problems.append(f"{where} warns {rule} jobs {warning.seconds} s before their time limit, too short for "
                            f"{need.job}: {need.explain()}; raise N in '--signal={WARNING_SIGNAL}@N' to at least "
                            f"{need.ceil_seconds}")
    return problems


def cap_problems(cfg: dict, a: dict | None = None, profile: Profile | None = None, rules=None) -> list[str]:
    """Jobs that cannot progress under ``cluster.max_runtime_min``: an attempt at the cap must hold
    the start-up (GPU jobs), one piece (a training step, a shard, a grading pair) and the rule's
    warning window. One message per job, with the numbers."""
    a = assumptions(cfg) if a is None else a
    profile = profile or Profile.from_file()
    cap = max_runtime(cfg)
    problems = []
    for rule in NOTICE_KINDS:
        if rules is not None and rule not in rules:
            continue
        window = warning_seconds(profile.limits(rule)) / 60.0
        try:
            work = notice_work(rule, cfg, a)
        except SystemExit:
            continue  # window_problems names the missing size
        for w in work:
            startup = 0.0 if NOTICE_KINDS[rule] == "grade" else a["startup_min"]
            piece = w.piece_s / 60.0
            if cap - startup - window < piece:
                what = f"training {w.job}" if rule == "train" else f"{rule} jobs of {w.job}"
                problems.append(f"cluster.max_runtime_min={cap:g} is too short for {what}: an attempt needs "
                                f"{startup:g} min start-up + {piece:.1f} min for {w.piece} + {window:g} min notice "
                                f"window ({profile.limits(rule).slurm_extra_key}) = {startup + piece + window:.1f} min")
    return problems



def render_windows(cfg: dict, profile: Profile, a: dict | None = None) -> list[str]:
    """One line per rule that stops on notice: the warning the profile asks for and the window its
    longest job needs (the same check as at the workflow's start)."""
    a = assumptions(cfg) if a is None else a
    lines = []
    for rule in NOTICE_KINDS:
        try:
            need = needed_window(rule, cfg, a)
        except SystemExit:
            continue
        warning = profile.limits(rule).warning
        given = f"--signal={warning.signal}@{warning.seconds}" if warning else "no warning"
        lines.append(f"  {rule:<20} {given:<20} needs " + (f"{need.ceil_seconds} s ({need.job}: {need.explain()})"
                                                               if need else "nothing (no job to price)"))
    return lines


