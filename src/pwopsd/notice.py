"""Stop on notice: a job that is told it will stop soon saves its work and exits resumable.

Slurm tells a job it will be stopped in three ways: a warning signal before the time limit (the
profile asks for one for every job kind that stops on notice, each with a window that holds its
piece of work, checked when the workflow starts: docs/cluster.md, "Notice windows"), SIGTERM when
the limit is reached, the job is preempted or cancelled (then SIGKILL after ``KillWait`` or the
preemption grace time), and nothing at all when a node dies. Slurm signals every process of the
job: the job's helpers (vLLM engine processes, grading workers) block the notice signals
(:func:`block_notice`, :func:`notice_blocked`) and are stopped by the job itself.

The job's process runs inside a :class:`Notice`: the first notice signal only sets a flag. The
training loop (:meth:`pwopsd.training.loop.Trainer.train`) finishes the optimizer step it is in
(rollouts and weight sync included), writes a checkpoint (all ranks agree on the step:
:func:`agreed`) and raises :class:`Interrupted`; generation, grading and the diagnostic's
generating phases finish the shard or pair in progress, keep it and raise it between two
(:func:`stop_on_notice`). The job exits with :data:`EXIT_INTERRUPTED` and the next attempt
(Snakemake's retry, or the same job requeued by Slurm) resumes. Work lost per notice: nothing when
the piece in progress finishes inside the window; otherwise that piece (the last checkpoint is then
the previous step's, written on the previous notice or by ``save_every``).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading

log = logging.getLogger(__name__)

# The exit status of a job that stopped on notice with a checkpoint written (BSD's EX_TEMPFAIL:
# "try again later"). Any non-zero status makes Snakemake retry the job; this one says why.
EXIT_INTERRUPTED = 75

# How long a launcher (torchrun) lets its processes finish their step and write the checkpoint
# after a notice before it kills them, when the job is not told its window: the train rule passes
# the profile's train warning (resource notice_window_s), which the workflow checks at start
# against the cost model's step + checkpoint + engine shutdown (pwopsd.cost.window_problems).
NOTICE_GRACE_SECONDS = 600

# SIGTERM: Slurm's time-limit warning (the profile's `--signal=TERM@N`), its kill at the limit,
# preemption, scancel, Snakemake stopping; SIGUSR1: a warning sent to a job run outside Snakemake's
# Slurm executor (under it, the job step's Snakemake dies of USR1: docs/cluster.md); SIGINT: Ctrl-C.
NOTICE_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT")


def notice_signals() -> set[signal.Signals]:
    return {getattr(signal, name) for name in NOTICE_SIGNALS}


def block_notice() -> None:
    """Block the notice signals in this process (a job's helper: a grading worker, an engine
    process) and in every process it starts: Slurm signals every process of the job, and a helper
    that exits on the notice (vLLM's engine core installs SIGTERM and SIGINT handlers that shut it
    down) takes the job's work in progress with it. The job's main process alone takes the notice
    and decides when its helpers stop. A blocked signal stays pending, so no handler a library
    installs later receives it; the mask is inherited across fork and exec."""
    signal.pthread_sigmask(signal.SIG_BLOCK, notice_signals())


@contextlib.contextmanager
def notice_blocked():
    """Processes started inside the block (vLLM's engine core, a data-parallel engine process)
    inherit a mask that blocks the notice signals (:func:`block_notice`); this thread's mask is
    restored afterwards, and a notice that came meanwhile is delivered to it then. vLLM's own
    shutdown of an engine core that cannot take SIGTERM ends it with SIGKILL after its 5-s
    grace (measured: docs/cluster.md)."""
    from multiprocessing import resource_tracker

    # The tracker of multiprocessing starts with the first process a job spawns, and unblocks
    # SIGINT and SIGTERM in the calling thread once it runs: started first, it leaves the mask alone.
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, [])  # this thread's mask, unchanged
    resource_tracker.ensure_running()
    signal.pthread_sigmask(signal.SIG_BLOCK, notice_signals())
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class Interrupted(RuntimeError):
    """Training stopped on a notice signal after writing a checkpoint; a rerun resumes from it."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


class Notice:
    """Records the first notice signal while active (a context manager). Outside the main thread
    (where Python cannot install handlers) it records nothing and the defaults stay in place."""

    def __init__(self, signals: tuple[str, ...] = NOTICE_SIGNALS):
        self.signals = [getattr(signal, name) for name in signals]
        self._received: str | None = None
        self._announced = False
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        # Record only. A handler runs between two bytecodes of whatever the main thread is doing,
        # which can be a write to the job's log stream (tqdm's progress bar, a log line): logging
        # from here raised "reentrant call inside BufferedWriter" and failed a generation job on
        # notice (seen in CI). The warning is said where the notice is read (:attr:`received`).
        if self._received is None:
            self._received = signal.Signals(signum).name

    @property
    def received(self) -> str | None:
        """The first notice signal's name, or None. The first read after it arrived says in the log
        what happens next."""
        if self._received is not None and not self._announced:
            self._announced = True
            log.warning("%s received: finishing this step, then a checkpoint and exit (status %d)",
                        self._received, EXIT_INTERRUPTED)
        return self._received

    def __enter__(self) -> "Notice":
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


def stop_on_notice(notice: "Notice | None", saved: str) -> None:
    """Raise :class:`Interrupted` when ``notice`` has received its signal, between two shards of a
    job that works in shards (generation, grading): ``saved`` says what the rerun resumes from."""
    if notice is not None and notice.received:
        raise Interrupted(f"stopped on {notice.received} with {saved}; a rerun resumes from it", step=0)


def agreed(flag: bool, world: int) -> bool:
    """Whether any rank has ``flag`` set: every rank gets the same answer at the same step (one
    all-reduce a step, with several processes), so all of them stop after the same step."""
    if world <= 1:
        return flag
    import torch
    import torch.distributed as dist

    t = torch.tensor([1 if flag else 0], dtype=torch.int32)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


@contextlib.contextmanager
def exit_on_notice(console: bool = False):
    """Turn :class:`Interrupted` into the process's exit with :data:`EXIT_INTERRUPTED`, logged (and
    with ``console``, a line on the job's own stderr, where Slurm's log and Snakemake see it)."""
    try:
        yield
    except Interrupted as exc:
        log.warning("%s", exc)
        if console:
            print(f"pwopsd job stopped on notice: {exc}", file=sys.__stderr__, flush=True)
        sys.exit(EXIT_INTERRUPTED)
