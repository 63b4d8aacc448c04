"""Rule train: one model x method training run (torchrun processes when several GPUs are given)."""

from pwopsd.accelerator import require_job_cuda
from pwopsd.cluster import slurm_restart
from pwopsd.config import grading_options
from pwopsd.io import one_writer, read_json, write_json
from pwopsd.runtime import set_threads, setup_logging
from pwopsd.standalone import standalone_snakemake
from pwopsd.training.job import adopt_checkpoints, checkpoint_dir, launch, other_runs, run_key, same_run_but_code
from pwopsd.notice import NOTICE_GRACE_SECONDS, exit_on_notice


def main(snakemake):
    log = setup_logging(snakemake.log[0])
    set_threads(snakemake.threads)
    require_job_cuda(snakemake)  # asked for GPUs and found none: stop now, not after a CPU fallback
    if restart := slurm_restart():  # requeued by Slurm: the same job id, run again
        log.info(restart)
    p = snakemake.params
    args = {
        "manifest": snakemake.input.model,
        "corpus": snakemake.input.corpus,
        "train": p.train,
        "dtype": p.dtype,
        "chat_template": p.chat_template,
        # The grader only scores rollouts for the log (rollout_accuracy), so it is neither a param
        # nor in the run key: a grader change reruns no training (issue 51); the job's log names it.
        "grading": grading_options(snakemake.config),
        "eval_step": p.eval_step,
        "adapter_out": snakemake.output.adapter,
        "log_out": snakemake.output.log,
        "processes": int(p.processes),  # gpus.train (at least 1): part of the run key and a param
    }
    # Where the rollout engines' weights go (node-local disk: training.rollout_sync_dir): a speed
    # setting, read from the config and outside the run key, as the tracker's.
    args["sync_dir"] = snakemake.config["training"]["rollout_sync_dir"]
    log.info("rollout accuracy (training log only) graded with %s", args["grading"])
    # Read from the config, not params: switching tracking on or off reruns no training run.
    args["tracking"] = {"settings": snakemake.config.get("tracking"), "model": snakemake.wildcards.model,
                        "run": snakemake.wildcards.method}
    if "schedule" in snakemake.input.keys():  # schedule_from: diagnostic -> the fitted (w_min, tau, s)
        fit = read_json(snakemake.input.schedule)
        args["train"] = {**p.train, "loss": {**p.train["loss"], **fit["params"]}}
        log.info("schedule fitted to the diagnostic of %s: %s", fit["model"], fit["params"])
    # Checkpoints of a run live in a folder keyed by everything that determines the run (settings,
    # base model content, corpus content, prompt switches, dtype, library versions, training code):
    # a resumed run never continues from a checkpoint of a different one.
    key = run_key(args)
    work_dir = checkpoint_dir(p.work_root, args, key)
    args["work_dir"] = str(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    write_json(key, work_dir / "run.json")  # what this checkpoint folder is the run of
    # A run interrupted across a change of the training code: its checkpoints are of the old code.
    # Restart (the default) or resume from them: the user's choice, said in the log either way.
    if not any(work_dir.glob("step-*/trainer_state.pt")) and (before := same_run_but_code(work_dir, key)):
        source, changed = before[0]
        if snakemake.config["training"]["resume_across_code_changes"]:
            step = adopt_checkpoints(source, work_dir)
            log.warning("the training code changed since this run's checkpoints were written (%s): resuming from %s "
                        "of %s as training.resume_across_code_changes asks", ", ".join(changed), step, source)
        else:
            log.warning("the training code changed since this run's checkpoints were written (%s): starting at step "
                        "0 (their folder %s is kept; set training.resume_across_code_changes: true to resume from it "
                        "when the change cannot touch the math)", ", ".join(changed), source)
    if not any(work_dir.glob("step-*/trainer_state.pt")) and (others := other_runs(work_dir, key)):
        log.info("no checkpoint of this run key yet (%s): starting at step 0; not resumed from the other run "
                 "folders of %s/%s: %s", work_dir.name, snakemake.wildcards.model, snakemake.wildcards.method,
                 "; ".join(others))
    # One copy of a run at a time (its checkpoints, step log and rollout sync folders). A notice
    # signal (Slurm's warning, time limit, preemption) ends the job with status 75 after a
    # checkpoint: the next attempt resumes.
    with exit_on_notice(console=True), one_writer(work_dir, f"training {snakemake.wildcards.model}/{snakemake.wildcards.method}"), \
            one_writer(snakemake.output.adapter, f"training {snakemake.wildcards.model}/{snakemake.wildcards.method}"):
        launch(args, processes=args["processes"], args_path=work_dir / "launch_args.json",
               log_path=snakemake.log[0],
               shutdown_timeout=int(snakemake.resources.get("notice_window_s", NOTICE_GRACE_SECONDS)))


if __name__ == "__main__":
    main(snakemake if "snakemake" in globals() else standalone_snakemake("train"))  # noqa: F821
