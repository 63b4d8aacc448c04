"""The full suite's long parts, started together when the session starts, and the time each took.

Four parts of the suite are long and need little of one another: the tiny workflow run (CPU, both
cores), the CPU vLLM environment and the vLLM-stack environment (downloads), the test Slurm's Debian
packages (downloads), and the vLLM engine tests (CPU, in the CPU vLLM environment, on a random tiny
model: they need neither the tiny run nor this process). One after another they left the cores idle
while packages downloaded and the downloads idle while the tiny model trained. ``conftest.py``
starts each part that a selected test needs when collection ends; the downloads then overlap the
CPU work, and the CPU work overlaps the fast tests. A test that needs a part waits for it
(:func:`result`): its failure, with the part's output, is that test's failure. Run alone, a test
starts the part it needs itself.

Each part is a :class:`Part` (a function run in a thread, after the parts it depends on); the
terminal summary prints when each started and ended (:func:`report`), and the CPU-seconds (user +
system) of the processes it ran (:func:`run_child`, each with every process below it that it
waited for), which the other parts running beside it do not move the way they move wall time; so
that a change that costs time shows where.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable


def machine_cpu_seconds() -> float | None:
    """CPU-seconds every process of this host has run since boot (``/proc/stat``: user, nice,
    system, irq, softirq, steal; not idle or iowait), or None where there is no ``/proc/stat``.
    The session's difference counts what no process tree of the session reports: the test
    Slurm's jobs run under ``slurmd``, not below this process."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class SnapshotDict(dict):
    """A dict whose iteration is over a snapshot: :func:`snapshot_loggers` makes logging's registry
    of loggers one."""

    def keys(self):
        return list(super().keys())

    def values(self):
        return list(super().values())

    def items(self):
        return list(super().items())

    def __iter__(self):
        return iter(list(super().keys()))


def snapshot_loggers() -> None:
    """Iterating logging's registry of loggers walks a snapshot, from now on in this process.

    pytest's log capture (``catching_logs.__enter__``, at each phase of each test) loops over
    ``logging.Logger.manager.loggerDict.values()`` without logging's lock, running Python code at
    each logger; a part's thread that registers a logger meanwhile (any import of torch,
    transformers, vLLM, ...) made that loop raise "dictionary changed size during iteration",
    reported as the failure of whichever test was starting (CI of 37be4dd on an AMD Zen 3 host:
    ``test_branch_viability.py::test_degenerate_pools_say_so``). ``list()`` of a dict's view runs in
    C under the GIL, so no thread can change the registry while the snapshot is taken. Called when
    this module is imported, before any part's thread starts."""
    manager = logging.Logger.manager
    if not isinstance(manager.loggerDict, SnapshotDict):
        manager.loggerDict = SnapshotDict(manager.loggerDict)


snapshot_loggers()

SESSION_START = time.time()
_MACHINE_START = machine_cpu_seconds()
_PARTS: dict[str, "Part"] = {}
_LOCK = threading.Lock()
_TIMES: dict[str, tuple[float, float]] = {}  # what the report lists: name -> (start, end), seconds
_CPU: dict[str, float] = {}  # name -> CPU-seconds of the processes the part ran
_ELSEWHERE: dict[str, dict[str, float]] = {}  # name -> of those, CPU-seconds of processes not below this one, by whose
_CURRENT = threading.local()  # the part whose thread this is


class Part:
    """One long part of the suite, run once in a thread of its own after its dependencies."""

    def __init__(self, name: str, fn: Callable[[], object], after: tuple[str, ...] = ()):
        self.name, self.fn, self.after = name, fn, after
        self._done = threading.Event()
        self._value: object = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"background: {name}", daemon=True)

    def start(self) -> "Part":
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            for dep in self.after:
                result(dep)
            _CURRENT.name = self.name
            with timed(self.name):
                self._value = self.fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting test
            self._error = exc
        finally:
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self):
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


class timed:
    """Records a phase's start and end for :func:`report` (a context manager)."""

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        self.start = time.time()
        return self

    def __exit__(self, *exc):
        _TIMES[self.name] = (self.start - SESSION_START, time.time() - SESSION_START)


PART_FUNCTIONS: dict[str, tuple[Callable[[], Callable[[], object]], tuple[str, ...]]] = {}


def part(name: str, after: tuple[str, ...] = ()):
    """Registers the function that makes part ``name`` (a factory, called when the part starts)."""

    def register(factory):
        PART_FUNCTIONS[name] = (factory, after)
        return factory

    return register


def start(name: str) -> Part:
    """Start part ``name`` (and the parts it runs after) unless it is running or done."""
    with _LOCK:
        if name in _PARTS:
            return _PARTS[name]
        factory, after = PART_FUNCTIONS[name]
    for dep in after:
        start(dep)
    with _LOCK:
        if name not in _PARTS:
            _PARTS[name] = Part(name, factory(), after).start()
        return _PARTS[name]


def result(name: str):
    """Wait for part ``name`` (started now if it was not) and return its value, or raise its error."""
    return start(name).result()


def report(total: float | None = None) -> list[str]:
    """Lines of the phase report: installs (from ``PWOPSD_CI_START``, set by ``.ci/run``), each
    timed part with its start and end, and the session."""
    now = time.time() - SESSION_START if total is None else total
    lines = []
    ci_start = os.environ.get("PWOPSD_CI_START")
    if ci_start:
        lines.append(f"{'installs (before the session)':<34}{SESSION_START - float(ci_start):7.0f} s")
    for name, (a, b) in sorted(_TIMES.items(), key=lambda kv: kv[1]):
        cpu = f"{_CPU[name]:7.0f} s" if name in _CPU else "      -  "
        where = "".join(f" ({whose} {sec:.0f} s)" for whose, sec in _ELSEWHERE.get(name, {}).items())
        lines.append(f"{name:<34}{b - a:7.0f} s   (from {a:4.0f} s to {b:4.0f} s)   CPU {cpu}{where}")
    import resource

    from dry_runs import CPU_SECONDS as forked  # the dry runs' processes: the fork server's children, not ours

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_all = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + forked[0]
    lines.append(f"{'session':<34}{now:7.0f} s   CPU {cpu_all:7.0f} s (this process {own.ru_utime + own.ru_stime:.0f} s, "
                 f"forked dry runs {forked[0]:.0f} s)")
    machine = machine_cpu_seconds()
    if machine is not None and _MACHINE_START is not None:
        lines.append(f"{'the host, every process':<34}{'':9}   CPU {machine - _MACHINE_START:7.0f} s "
                     "(the test Slurm's jobs too)")
    if ci_start:
        lines.append(f"{'in all (installs and session)':<34}{time.time() - float(ci_start):7.0f} s")
    return lines


def add_cpu(seconds: float, whose: str) -> None:
    """Count toward the current part's CPU-seconds ``seconds`` of processes it had started that did
    not run below this one, which the report names (``whose``): the test Slurm's jobs run under
    ``slurmd``, and Slurm's accounting measures them."""
    part = getattr(_CURRENT, "name", None)
    if part is None:
        return
    with _LOCK:
        _CPU[part] = _CPU.get(part, 0.0) + seconds
        theirs = _ELSEWHERE.setdefault(part, {})
        theirs[whose] = theirs.get(whose, 0.0) + seconds


_CHILDREN: set = set()


def run_child(cmd, **kwargs):
    """``subprocess.run(cmd, capture_output=True, text=True, **kwargs)`` whose process
    :func:`stop_children` ends if the session ends before it does (``-x``, Ctrl-C)."""
    import subprocess

    proc = _Measured(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kwargs)
    _CHILDREN.add(proc)
    try:
        out, err = proc.communicate()
    finally:
        _CHILDREN.discard(proc)
        part = getattr(_CURRENT, "name", None)
        if part is not None and proc.cpu_seconds is not None:
            with _LOCK:
                _CPU[part] = _CPU.get(part, 0.0) + proc.cpu_seconds
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _popen():
    import subprocess

    return subprocess.Popen


class _Measured(_popen()):
    """A Popen that reaps its process with ``wait4``, keeping the CPU-seconds (user + system) of it
    and of every process below it that it waited for (Linux's rusage of a reaped child)."""

    cpu_seconds: float | None = None

    def _try_wait(self, wait_flags):
        try:
            pid, status, usage = os.wait4(self.pid, wait_flags)
        except ChildProcessError:  # reaped elsewhere (a SIGCHLD handler): as Popen does
            return self.pid, 0
        if pid == self.pid:
            self.cpu_seconds = usage.ru_utime + usage.ru_stime
        return pid, status


def waiting_last(items: list, module: Callable, waits: Callable, last: Callable = lambda item: False) -> list:
    """``items`` (tests) with, within each module, those that wait for a part after those that do
    not, and the tests for which ``last`` is true (those that wait for the tiny run, the longest
    part) at the end of the session, by module; the tests' order kept otherwise (a stable sort).

    Without the second rule the session waited in the first module with a test of the tiny run
    (test_slurm.py) while the quick tests of every module after it ran only once the tiny run had
    ended, on one core: 424 s after it (CI on Ice Lake)."""
    rank: dict = {}
    for item in items:
        rank.setdefault(module(item), len(rank))
    return sorted(items, key=lambda item: (bool(last(item)), rank[module(item)], bool(waits(item))))


_AT_END: list[Callable[[], object]] = []


def at_session_end(fn: Callable[[], object]) -> None:
    """Call ``fn`` when the session ends (a part's clean-up, should no fixture have done it)."""
    _AT_END.append(fn)


def stop_children() -> None:
    """End every background process still running, with its process group (Snakemake's jobs),
    and run the parts' clean-ups."""
    import signal

    for proc in list(_CHILDREN):
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for fn in _AT_END:
        try:
            fn()
        except Exception:  # noqa: BLE001 - a clean-up must not hide the session's result
            pass


def report_lines_wanted() -> bool:
    """Whether a phase report is worth printing: some part ran, or ``.ci/run`` asked for one."""
    return bool(_TIMES) or bool(os.environ.get("PWOPSD_CI_START"))
