"""Atomic, self-describing file output.

Every result file is written to a temporary sibling first and renamed into place, so an
interrupted job never leaves a half-written output that Snakemake (or a user) could mistake
for a finished one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

log = logging.getLogger(__name__)


def fingerprint(obj: Any) -> str:
    """A short hash of a JSON-able description of everything that determines a result: names the
    folders of reusable partial work (generation shards, training checkpoints)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def node_folder(text: str) -> Path:
    """A configured folder with ``~`` and environment variables expanded on the node that runs this
    (``$TMPDIR`` of a Slurm job); a variable the node does not set gives its temporary folder, never
    a folder literally named ``$TMPDIR``."""
    place = os.path.expandvars(os.path.expanduser(text))
    return Path(tempfile.gettempdir() if "$" in place else place)


def sha256_file(path: str | os.PathLike, chunk_size: int = 1 << 20) -> str:
    """SHA-256 hex digest of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk_size), b""):
            h.update(block)
    return h.hexdigest()


def _partial_root(output: str | os.PathLike) -> Path:
    output = Path(output)
    return output.parent / f".{output.name}.partial"


KEY_FILE = "key.json"


def partial_dir(output: str | os.PathLike, key: Any, part: str = "shards") -> Path:
    """Where the finished pieces of a resumable job for ``output`` are kept (generation shards,
    graded benchmark-seed pairs, the diagnostic's spines and continuations): a hidden sibling
    folder (not a declared output, so Snakemake does not delete it when the job stops early),
    ``<part>/<fingerprint of key>/``, with the key beside the pieces (``key.json``).

    ``key`` must hold everything that determines the pieces (:func:`pwopsd.keys.part_key`: the
    weights by content, dtype, backend, code, settings, inputs). Pieces of ``part`` kept under
    another key (the model was retrained, the code or the dtype changed, ...) are discarded here,
    and the log names the fields that changed: they are never mixed with new ones."""

    root = _partial_root(output) / part
    name = fingerprint(key)
    if root.is_dir():
        for other in sorted(p for p in root.iterdir() if p.is_dir() and p.name != name):
            try:
                old = json.loads((other / KEY_FILE).read_text())
                why = describe_change(old, key)
            except (OSError, ValueError):
                why = "its key file is missing or unreadable"
            log.warning("%s: discarding %d kept %s in %s, made under another key (changed: %s)", output,
                        sum(1 for f in other.iterdir() if f.name != KEY_FILE), part, other, why)
            shutil.rmtree(other, ignore_errors=True)
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / KEY_FILE).exists():
        write_json(key, folder / KEY_FILE)
    return folder


def clear_partial(output: str | os.PathLike) -> None:
    """Remove every kept piece of ``output`` (once the output itself is written)."""
    shutil.rmtree(_partial_root(output), ignore_errors=True)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it onto ``path`` only on success.

    Works for files and for directories (e.g. ``save_pretrained`` targets).
    """
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    target = tmp / final.name
    try:
        yield target
        if final.is_dir() and not final.is_symlink():
            shutil.rmtree(final)
        os.replace(target, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class ResultFileError(ValueError):
    """An input file of a job cannot be read; the message names the file and what to do."""


def read_json(path: str | os.PathLike) -> Any:
    """Parse a JSON file, naming the file when it is missing or not valid JSON (a truncated file
    left by a killed job, a hand edit)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ResultFileError(f"{path}: file does not exist") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ResultFileError(f"{path}: not valid JSON ({exc}; {len(text)} bytes); delete it so that the job "
                              "writing it runs again") from None


def read_parquet(path: str | os.PathLike, **kwargs):
    """Read a parquet file into pandas, naming the file when it cannot be read."""
    import pandas as pd

    try:
        return pd.read_parquet(path, **kwargs)
    except FileNotFoundError:
        raise ResultFileError(f"{path}: file does not exist") from None
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise ResultFileError(f"{path}: not a readable parquet file ({str(exc)[:300]}); delete it so that the job "
                              "writing it runs again") from None


def write_json(obj: Any, path: str | os.PathLike) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def write_parquet(df, path: str | os.PathLike, metadata: dict[str, Any] | None = None) -> None:
    """Write a pandas DataFrame as parquet atomically; ``metadata`` is stored as JSON in the
    file's key-value metadata under ``pwopsd`` (read it back with :func:`read_parquet_metadata`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(df, preserve_index=False)
    if metadata is not None:
        kv = dict(table.schema.metadata or {})
        kv[b"pwopsd"] = json.dumps(metadata, sort_keys=True, default=str).encode()
        table = table.replace_schema_metadata(kv)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def read_parquet_metadata(path: str | os.PathLike) -> dict[str, Any]:
    import pyarrow.parquet as pq

    kv = pq.read_schema(path).metadata or {}
    raw = kv.get(b"pwopsd")
    return json.loads(raw) if raw else {}


class WriterLockedError(RuntimeError):
    """Another process holds the lock of a job's outputs: a second copy of the job is running."""


def lock_path(target: str | os.PathLike) -> Path:
    """The lock file of an output or a run folder: a hidden sibling, ``.<name>.lock``."""
    target = Path(target)
    return target.parent / f".{target.name}.lock"


class LocksUnavailableError(RuntimeError):
    """The filesystem of a job's outputs has no working file locks (``ENOLCK``)."""


def mount_of(path: str | os.PathLike) -> str:
    """``mount point (filesystem type)`` of the mount that holds ``path`` (from /proc/mounts)."""
    target = os.path.realpath(path)
    best = ("/", "?")
    try:
        with open("/proc/mounts") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 3 and (target == parts[1] or target.startswith(parts[1].rstrip("/") + "/")) \
                        and len(parts[1]) >= len(best[0]):
                    best = (parts[1], parts[2])
    except OSError:
        pass
    return f"{best[0]} ({best[1]})"


@contextlib.contextmanager
def one_writer(target: str | os.PathLike, what: str = "this job") -> Iterator[Path]:
    """Hold an exclusive lock on ``target`` (a job's output, a training run's folder) while the block
    runs: a second copy of the same job (a lost Snakemake head restarted with --rerun-incomplete
    while the old Slurm job still runs) stops at once with a message naming the holder, instead of
    writing the same kept pieces, checkpoints and sync folders.

    The lock is a POSIX record lock (``lockf``): it belongs to this process alone. Processes it
    forks (the grader pool's workers) do not inherit it, so a job killed with SIGKILL frees it at
    once even while orphaned workers live on (an ``flock`` lock is shared with forked children and
    was held by them: issue 51); NFS carries POSIX locks between nodes (NLM). A lock file left by a
    holder that is gone is taken over, and the log says whose it was. A filesystem without working
    locks (``ENOLCK``) stops the job with :class:`LocksUnavailableError` naming the folder and the
    mount. The file itself stays (unlinking a lock file races with a process that has it open)."""
    import errno
    import fcntl
    import logging
    import socket
    import time

    path = lock_path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    fh = open(path, "a+")
    try:
        try:
            fcntl.lockf(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno == errno.ENOLCK:
                raise LocksUnavailableError(
                    f"{what}: the filesystem of {path.parent} (mount {mount_of(path.parent)}) has no working file locks "
                    "(ENOLCK), so two copies of a job could not be kept apart: put the workflow's results/ on a "
                    "filesystem with locks (mount NFS with its lock service; node-local or Lustre/BeeGFS with "
                    "flock enabled)") from None
            if exc.errno not in (errno.EACCES, errno.EAGAIN):
                raise
            fh.seek(0)
            holder = fh.read().strip() or "a process that wrote no details"
            raise WriterLockedError(
                f"{what} is already running: {path} is locked by {holder}. Two copies would write the same "
                "outputs, kept pieces and checkpoints; wait for that one to end (or cancel it: scancel its Slurm "
                "job), then run again (snakemake --rerun-incomplete)") from None
        fh.seek(0)
        previous = fh.read().strip()
        if previous:
            logging.getLogger("pwopsd").info("%s: took over the lock %s from %s, which is gone", what, path, previous)
        fh.seek(0)
        fh.truncate()
        job = os.environ.get("SLURM_JOB_ID")
        fh.write(f"host {socket.gethostname()}, pid {os.getpid()}" + (f", Slurm job {job}" if job else "")
                 + f", since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        fh.flush()
        yield path
    finally:
        fh.close()  # releases the lock


def describe_change(stored: Any, key: Any) -> str:
    """The fields in which ``key`` differs from a ``stored`` one (read back from its JSON file), for
    the log line that says why kept work is not reused."""
    return ", ".join(changed_fields(stored, json.loads(json.dumps(key, sort_keys=True, default=str))))


def changed_fields(old: Any, new: Any, prefix: str = "", limit: int = 8) -> list[str]:
    """Dotted paths of the fields that differ between two keys (at most ``limit``; a list or value
    that differs is named once): what a log line says when kept work is discarded."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in sorted(set(old) | set(new), key=str):
            if old.get(k, _MISSING) != new.get(k, _MISSING):
                out.extend(changed_fields(old.get(k, _MISSING), new.get(k, _MISSING), f"{prefix}{k}.", limit))
            if len(out) >= limit:
                return out[:limit]
        return out
    return [prefix.rstrip(".") or "(whole key)"]


_MISSING = object()
