"""Answer extraction and grading.

Extraction (``extract_boxed``) follows the reference implementation (``evaluate_math.py``): take
the *last* occurrence of ``\\boxed`` anywhere in the text (thinking part included), match braces
forward from it, and keep the result only if the span starts with ``\\boxed{`` and its braces
balance. ``\\boxed 5``, a truncated ``\\boxed{`` and ``\\fbox{..}`` give ``None`` (unformatted); if the
last ``\\boxed`` is malformed, no earlier one is tried.

Grading (``grade_pair``) is the reference ``grade_answer``: wrap each side in ``$...$`` unless it
contains a ``$``, ``parse(..., fallback_mode="no_fallback")``, ``verify(gold, pred)`` with gold first,
plus a normalized string-equality fallback (lower-cased, ``$`` and spaces removed). When the
fallback fires is a choice (``GradingOptions.string_fallback``): ``"parse_failure"`` (the paper:
"string-equality fallback for parsing failures") or ``"exception"`` (the reference code, where it
almost never fires); so are the gold's wrapping and what an empty ``\\boxed{}`` is graded as.

A job grades with several named graders at once (``grading.graders``): the one ``grading.verdicts``
names gives the results (Pass/Avg/Maj, the tables); the others' verdicts are carried beside it.
The paper's configuration grades with ``reference`` (the reference code's grader, which produced the
published numbers) and carries ``corrected`` (the parse-failure fallback, boxed golds). See
``docs/decisions.md``.

math-verify's own timeout is a SIGALRM that cannot interrupt long C-level big-integer work and
breaks in threads, so :class:`GraderPool` runs every grade in a worker *process* with a hard
wall-clock limit; a grade past the limit is recorded as ``timeout`` (incorrect), the worker is
killed and replaced (one whose grade ended by itself past the limit, while the pool was busy, is
kept), and grading goes on. Model outputs only ever reach math-verify's parser;
nothing here evaluates them.
"""

from __future__ import annotations

import collections
import logging
import multiprocessing as mp
import os
import sys
import time
from dataclasses import dataclass
from functools import lru_cache
from multiprocessing.connection import wait
from typing import Iterable, NamedTuple, Sequence

log = logging.getLogger(__name__)

BOXED = "\\boxed"
STATUS_OK = "ok"
STATUS_TIMEOUT = "timeout"
STATUS_CRASHED = "crashed"
STATUS_UNFORMATTED = "unformatted"
STATUS_OVER_BUDGET = "over_budget"  # not graded: the batch's time budget ran out first
# What the reference stores as the predicted answer when the extraction is None or empty; an empty
# ``\boxed{}`` is graded (and clustered for Maj@N) as this string under ``empty_box="placeholder"``.
NO_BOXED_PLACEHOLDER = "[No boxed answer found]"


def extract_boxed(text: str | None) -> str | None:
    if not text:
        return None
    start = text.rfind(BOXED)
    if start < 0:
        return None
    i = start + len(BOXED)
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        c = text[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j].strip()
    return None


def integer_answer(text: str | None) -> int | None:
    """The boxed answer as an integer, or None (used by the tiny model's build check only)."""
    inner = extract_boxed(text)
    if inner is None:
        return None
    try:
        return int(inner.replace(" ", ""))
    except ValueError:
        return None


@dataclass(frozen=True)
class GradingOptions:
    """How a (gold, prediction) pair is graded. ``string_fallback``: ``parse_failure`` (paper) or
    ``exception`` (reference code). ``gold_wrapping``: ``dollar`` (reference: ``$gold$`` unless the
    gold has a ``$``, so the three MATH-500 ``\\$`` golds never parse) or ``boxed``
    (``\\boxed{gold}``, which parses them). ``empty_box``: ``placeholder`` (reference: an empty
    ``\\boxed{}`` is stored as :data:`NO_BOXED_PLACEHOLDER`, which math-verify parses as a product of
    symbols, so it never matches a gold and all empty boxes of a problem form one Maj@N cluster) or
    ``empty`` (graded as the empty string: never correct; empty boxes cluster together only through
    the ``parse_failure`` string fallback)."""

    string_fallback: str = "parse_failure"
    gold_wrapping: str = "dollar"
    empty_box: str = "empty"
    parse_timeout: int = 5
    verify_timeout: int = 5

    def __post_init__(self):
        if self.string_fallback not in ("parse_failure", "exception"):
            raise ValueError(f"grading.string_fallback must be 'parse_failure' or 'exception', got {self.string_fallback!r}")
        if self.gold_wrapping not in ("dollar", "boxed"):
            raise ValueError(f"grading.gold_wrapping must be 'dollar' or 'boxed', got {self.gold_wrapping!r}")
        if self.empty_box not in ("placeholder", "empty"):
            raise ValueError(f"grading.empty_box must be 'placeholder' or 'empty', got {self.empty_box!r}")

    def stored(self, answer: str) -> str:
        """The answer as the grader sees it (the placeholder for an empty box, when so configured)."""
        return NO_BOXED_PLACEHOLDER if (answer == "" and self.empty_box == "placeholder") else answer


def normalize_string(s: str) -> str:
    return str(s).replace("$", "").replace(" ", "").lower().strip()


def _wrap(s: str) -> str:
    return s if "$" in s else f"${s}$"


@lru_cache(maxsize=65536)
def _parsed(text: str, timeout: int):
    from math_verify import parse

    return parse(text, fallback_mode="no_fallback", parsing_timeout=timeout)


def grade_pair(gold: str, pred: str | None, options: GradingOptions = GradingOptions(), *, gold_is_reference: bool = True) -> bool:
    """Is ``pred`` equivalent to ``gold``? (Runs math-verify in the calling thread: use it from a
    process's main thread, as :class:`GraderPool` workers do.)

    ``gold_is_reference`` applies ``options.gold_wrapping`` to the gold side; equivalence checks
    between two predictions (Maj@N clustering) pass False and wrap both sides alike.
    """
    from math_verify import verify

    if pred is None:
        return False
    gold, pred = str(gold), options.stored(str(pred))
    if not gold_is_reference:
        gold = options.stored(gold)
    gold_text = f"\\boxed{{{gold}}}" if (gold_is_reference and options.gold_wrapping == "boxed") else _wrap(gold)
    try:
        g = _parsed(gold_text, options.parse_timeout)
        p = _parsed(_wrap(pred), options.parse_timeout)
        if options.string_fallback == "parse_failure" and (not g or not p):
            return normalize_string(gold) == normalize_string(pred)
        return bool(verify(g, p, timeout_seconds=options.verify_timeout))
    except Exception:
        return normalize_string(gold) == normalize_string(pred)


class Grade(NamedTuple):
    correct: bool
    status: str
    seconds: float


# ----------------------------------------------------------------------------------------------
# Worker pool with a hard wall-clock limit per grade.


def _worker_main(conn, options: GradingOptions) -> None:  # runs in the child process
    from pwopsd.notice import block_notice

    # The parent handles Ctrl-C and the notice signals (Slurm signals every process of the job):
    # it finishes its benchmark and closes the pool, a worker never dies with a task in hand.
    block_notice()
    try:
        import math_verify  # noqa: F401
    except ImportError as exc:
        conn.send(("import-error", str(exc)))
        return
    # Warm up before saying ready: a fresh worker's first grade builds math-verify's parsers, which
    # on a loaded host took longer than a 1 s limit, and the pair after a timeout (the replacement
    # worker's first) was then blamed for it.
    try:
        grade_pair("1", "1", options)
    except Exception:  # noqa: BLE001 - a worker that cannot grade says so on its first pair
        pass
    conn.send(("ready", os.getpid()))
    while True:
        try:
            chunk = conn.recv()
        except (EOFError, OSError):
            return
        if chunk is None:
            return
        # A chunk of tasks; each result is sent as soon as it is known, so the parent always
        # knows which task is running and since when.
        for key, gold, pred, gold_is_reference, task_options in chunk:
            t0 = time.perf_counter()
            try:
                ok = grade_pair(gold, pred, task_options or options, gold_is_reference=gold_is_reference)
                status = STATUS_OK
            except BaseException:  # math-verify's TimeoutException is a BaseException
                ok, status = False, STATUS_CRASHED
            conn.send((key, ok, status, time.perf_counter() - t0))


class _Worker:
    def __init__(self, ctx, options):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, options), daemon=True)
        self.proc.start()
        child.close()
        msg = self.conn.recv()
        if msg[0] != "ready":
            raise RuntimeError(f"grading worker could not start: {msg[1]} (is math-verify installed?)")
        self.inflight: collections.deque = collections.deque()  # tasks sent, not yet answered
        self.started = 0.0  # when the first in-flight task started

    def kill(self):
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)
        self.conn.close()


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


class GraderPool:
    """Grade many (gold, prediction) pairs in parallel worker processes with a hard time limit.

    Identical pairs are graded once, within a batch and across the batches of a pool (a verdict
    that a worker returned is kept; timeouts, crashes and budget cut-offs are not, so such a pair is
    tried again when it comes back). ``options`` are the default verdict options; a batch may name
    others (:meth:`grade_pairs`), so one pool serves several graders. Use as a context manager or
    call :meth:`close`.
    """

    def __init__(self, workers: int | None = None, timeout: float = 5.0, options: GradingOptions = GradingOptions(),
                 progress: bool = False):
        self.n_workers = workers or default_workers()
        self.timeout = float(timeout)
        self.options = options
        self.progress = progress
        self.max_chunk = 32
        method = "fork" if sys.platform.startswith("linux") else "spawn"
        self._ctx = mp.get_context(method)
        if method == "fork":
            # Import and warm up math-verify (sympy, the ANTLR parser) once here; forked workers,
            # replacements included, then start warm.
            grade_pair("1", "1", options)
        self._workers: list[_Worker] = []
        self._verdicts: dict[tuple, Grade] = {}  # (gold, pred, gold_is_reference, options) -> a worker's verdict
        self.stats = {"graded": 0, "deduplicated": 0, "timeouts": 0, "crashes": 0, "restarts": 0, "over_budget": 0}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        for w in self._workers:
            try:
                w.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
            w.kill()
        self._workers = []

    def _ensure_workers(self):
        while len(self._workers) < self.n_workers:
            self._workers.append(_Worker(self._ctx, self.options))

    def grade_pairs(self, pairs: Sequence[tuple[str, str | None]] | Sequence[tuple[str, str | None, bool]],
                    budget: float | None = None, options: GradingOptions | None = None) -> list[Grade]:
        """Grade ``(gold, pred[, gold_is_reference])`` pairs; ``pred=None`` is unformatted (False).

        ``budget``: wall-clock seconds for the whole batch; pairs not graded when it runs out get
        status ``over_budget`` (False), their workers are stopped and replaced. ``options``: the
        verdict options for this batch (default: the pool's)."""
        options = options or self.options
        results: list[Grade | None] = [None] * len(pairs)
        unique: dict[tuple, list[int]] = {}
        for i, pair in enumerate(pairs):
            gold, pred = str(pair[0]), pair[1]
            ref = bool(pair[2]) if len(pair) > 2 else True
            if unformatted(pred):
                results[i] = Grade(False, STATUS_UNFORMATTED, 0.0)
                continue
            unique.setdefault((gold, str(pred), ref, options), []).append(i)
        self.stats["deduplicated"] += sum(len(v) - (key not in self._verdicts) for key, v in unique.items())
        for key in [k for k in unique if k in self._verdicts]:
            for i in unique.pop(key):
                results[i] = self._verdicts[key]
        deadline = None if budget is None else time.monotonic() + max(0.0, float(budget))
        for key, grade in self._run(list(unique), deadline):
            if grade.status == STATUS_OK:
                self._verdicts[key] = grade
            for i in unique[key]:
                results[i] = grade
        return results  # type: ignore[return-value]

    def _run(self, tasks: list[tuple], deadline: float | None = None) -> Iterable[tuple[tuple, Grade]]:
        if not tasks:
            return
        if deadline is not None and time.monotonic() >= deadline:
            self.stats["over_budget"] += len(tasks)
            for task in tasks:
                yield task, Grade(False, STATUS_OVER_BUDGET, 0.0)
            return
        self._ensure_workers()
        pending = collections.deque(tasks)
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(tasks), desc="grade", unit="pair", mininterval=5)
        try:
            while pending or any(w.inflight for w in self._workers):
                for w in self._workers:
                    if not w.inflight and pending:
                        # Chunks amortize the pipe round trip; small enough to balance the workers.
                        size = max(1, min(self.max_chunk, len(pending) // (2 * self.n_workers)))
                        chunk = [pending.popleft() for _ in range(min(size, len(pending)))]
                        w.inflight.extend(chunk)
                        w.started = time.monotonic()
                        w.conn.send([(t, *t) for t in chunk])
                busy = [w for w in self._workers if w.inflight]
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    left = [t for w in busy for t in w.inflight] + list(pending)
                    self.stats["over_budget"] += len(left)
                    for task in left:
                        yield task, Grade(False, STATUS_OVER_BUDGET, 0.0)
                    pending.clear()
                    for w in busy:
                        w.inflight.clear()
                        self._replace(w)
                    break
                next_deadline = min(w.started + self.timeout for w in busy)
                if deadline is not None:
                    next_deadline = min(next_deadline, deadline)
                ready = wait([w.conn for w in busy], timeout=max(0.0, next_deadline - now))
                by_conn = {id(w.conn): w for w in busy}
                for conn in ready:
                    w = by_conn[id(conn)]
                    while w.inflight and conn.poll():
                        try:
                            key, ok, status, seconds = conn.recv()
                        except (EOFError, OSError):
                            task = w.inflight.popleft()
                            self.stats["crashes"] += 1
                            yield task, Grade(False, STATUS_CRASHED, time.monotonic() - w.started)
                            pending.extendleft(reversed(w.inflight))
                            w.inflight.clear()
                            self._replace(w)
                            break
                        w.inflight.popleft()
                        w.started = time.monotonic()
                        if status == STATUS_OK and seconds >= self.timeout:
                            # It ran past the hard limit while this loop was held (e.g. starting
                            # a replacement worker) and ended by itself: a timeout all the same.
                            log.warning("grade took %.1fs, over the %.1fs hard limit: gold=%r pred=%r",
                                        seconds, self.timeout, key[0][:80], key[1][:80])
                            self.stats["timeouts"] += 1
                            ok, status = False, STATUS_TIMEOUT
                        if status == STATUS_CRASHED:
                            self.stats["crashes"] += 1
                        self.stats["graded"] += 1
                        if bar is not None:
                            bar.update(1)
                        yield key, Grade(bool(ok), status, float(seconds))
                now = time.monotonic()
                for w in [w for w in self._workers if w.inflight and now - w.started >= self.timeout]:
                    task = w.inflight.popleft()
                    log.warning("grade exceeded %.1fs hard limit, worker %d killed: gold=%r pred=%r",
                                self.timeout, w.proc.pid, task[0][:80], task[1][:80])
                    self.stats["timeouts"] += 1
                    yield task, Grade(False, STATUS_TIMEOUT, now - w.started)
                    pending.extendleft(reversed(w.inflight))  # the rest of its chunk goes back
                    w.inflight.clear()
                    self._replace(w)
                    if bar is not None:
                        bar.update(1)
        finally:
            if bar is not None:
                bar.close()

    def _replace(self, worker: _Worker):
        worker.kill()
        self._workers.remove(worker)
        self._workers.append(_Worker(self._ctx, self.options))
        self.stats["restarts"] += 1


def grade_answers(predictions: Sequence[str | None], golds: Sequence[str], *, workers: int | None = None,
                  timeout: float = 5.0, options: GradingOptions = GradingOptions()) -> list[bool]:
    """Grade ``predictions[i]`` against ``golds[i]`` in parallel with a hard per-grade limit.

    ``None`` predictions (unformatted) score False; a grade that times out or crashes scores False.
    """
    if len(predictions) != len(golds):
        raise ValueError(f"{len(predictions)} predictions but {len(golds)} golds")
    with GraderPool(workers=workers, timeout=timeout, options=options) as pool:
        return [g.correct for g in pool.grade_pairs(list(zip(golds, predictions)))]


def unformatted(pred) -> bool:
    """Whether an extracted answer is missing: ``None``, or the NaN (or ``pd.NA``) that a pandas 3
    string column holds where :func:`extract_boxed` gave ``None``; graded as the text "nan", such a
    sample would be compared with the gold as the expression n*a*n."""
    if pred is None or type(pred).__name__ == "NAType":
        return True
    return isinstance(pred, float) and pred != pred


@dataclass(frozen=True)
class GradingSettings:
    """A rule's grading params (``pwopsd.config.grading_options``) as objects: the per-grade hard
    limit, the Maj@N clustering budget per problem, the named graders and the one whose verdicts are
    the results (``verdicts``); :attr:`options` are that grader's."""

    timeout: float
    maj_budget: float
    graders: dict
    verdicts: str

    @property
    def options(self) -> GradingOptions:
        return self.graders[self.verdicts]


def pool_settings(grading: dict) -> GradingSettings:
    graders = {name: GradingOptions(**opts) for name, opts in grading["graders"].items()}
    if grading["verdicts"] not in graders:
        raise ValueError(f"grading.verdicts: {grading['verdicts']!r} is not one of grading.graders ({', '.join(graders)})")
    return GradingSettings(float(grading["timeout"]), float(grading["maj_budget"]), graders, grading["verdicts"])


def answer_grader(grading: dict, workers: int):
    """``grade(predictions, golds) -> list[bool]`` with the verdicts grader of the rule's grading params."""
    gs = pool_settings(grading)
    timeout, options = gs.timeout, gs.options

    def grade(predictions, golds):
        return grade_answers(predictions, golds, workers=max(1, int(workers)), timeout=timeout, options=options)

    return grade
