"""Snakemake dry runs forked from a process that has imported Snakemake once.

A Snakemake start costs its imports first: ``import snakemake.cli`` takes about 2 CPU-seconds on a
2-core AMD Zen 3 host (its executor plugins are imported to register their settings: the Slurm
plugin brings pandas, SQLModel and SQLAlchemy), and a dry run of the paper's DAG about 2.5 in all.
The fast tier started Snakemake 53 times (134 of its 351 CPU-seconds), CI about 80 times; then,
with dry runs forked, 30 Snakemake commands (70 CPU-s) and 6 cost plans that each started one.

So a run of Snakemake that runs no job (a dry run, ``--dag``, ``--list-rules``, ``--lint``, ...: the
cost plan's dry runs too) is run here by a process forked from multiprocessing's fork server, which
has imported ``snakemake.cli`` (and nothing of this project: the Snakefile's imports run in each
child, after its environment is set): the child takes the run's working directory, environment and
arguments, points its stdout and stderr at files and calls ``snakemake.cli.main``, the function
``python -m snakemake`` calls. Its output and exit status are those of the command. The fork
server is a fresh interpreter (not a fork of the test session, whose parts run threads), started
on the first dry run. Real runs (jobs executed, Slurm) keep a ``python -m snakemake`` process of
their own.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading

_LOCK = threading.Lock()
_CONTEXT: list = []
CPU_SECONDS = [0.0]  # the forked dry runs' CPU-seconds (the session's report adds them to its own)


def runs_no_job(args) -> bool:
    """Whether Snakemake's command line ``args`` runs no job: a dry run (``-n``, ``-np``), ``--dag``,
    ``--list-rules``, ``--lint``, ``--summary``, ... as Snakemake's own parser reads it
    (:func:`pwopsd.cluster.planning_flag`, the check the Slurm profile makes)."""
    from pwopsd.cluster import planning_flag

    return planning_flag([str(a) for a in args]) is not None


def run_snakemake(args, cwd, env: dict, start) -> subprocess.CompletedProcess:
    """``python -m snakemake ARGS`` in ``cwd`` with ``env``: forked (:func:`run`) when it runs no job,
    else started as a command by ``start(command, cwd=..., env=...)`` (the session's
    ``background.run_child``). The suite's one way to run Snakemake: ``conftest.run_snakemake`` and
    the cost plan's and status report's dry runs (``pwopsd.cost.hours.run_snakemake``) call it."""
    args = [str(a) for a in args]
    if runs_no_job(args):
        return run(args, cwd=cwd, env=env)
    return start([sys.executable, "-m", "snakemake", *args], cwd=cwd, env=env)


def _context():
    with _LOCK:
        if not _CONTEXT:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(["snakemake.cli", "dry_runs"])
            _CONTEXT.append(ctx)
        return _CONTEXT[0]


def _child(args: list[str], cwd: str, env: dict, out: str, err: str, cpu: str) -> None:
    """In the forked process: the command ``python -m snakemake ARGS`` in ``cwd`` with ``env``."""
    import logging
    import resource
    import traceback

    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = ["snakemake", *args]
    code = 0
    try:
        from snakemake.cli import main

        main(args)
    except SystemExit as exc:  # as the interpreter ends on it
        if isinstance(exc.code, int) or exc.code is None:
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - an uncaught exception: its traceback and status 1
        traceback.print_exc()
        code = 1
    finally:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        usage = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        with open(cpu, "w") as f:
            f.write(str(sum(u.ru_utime + u.ru_stime for u in usage)))
    os._exit(code)


def run(args, cwd, env: dict) -> subprocess.CompletedProcess:
    """``python -m snakemake ARGS`` (a dry run) in ``cwd`` with ``env``, forked from the fork server:
    its exit status, stdout and stderr."""
    args = [str(a) for a in args]
    with tempfile.TemporaryDirectory(prefix="dry-run-") as tmp:
        out, err, cpu = (os.path.join(tmp, name) for name in ("out", "err", "cpu"))
        proc = _context().Process(target=_child, args=(args, str(cwd), dict(env), out, err, cpu))
        proc.start()
        proc.join()
        with open(out) as o, open(err) as e:
            stdout, stderr = o.read(), e.read()
        if os.path.exists(cpu):
            with open(cpu) as c, _LOCK:
                CPU_SECONDS[0] += float(c.read() or 0)
    return subprocess.CompletedProcess([sys.executable, "-m", "snakemake", *args], proc.exitcode, stdout, stderr)
