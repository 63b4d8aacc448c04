"""Benchmark and training-corpus preparation.

Each dataset entry in the config has a ``source`` (``hf``: Hub dataset id + split + revision;
``local``: a jsonl/json/csv/parquet file with an optional SHA-256; ``tiny``: synthetic arithmetic)
and a ``columns`` mapping. :func:`prepare_dataset` turns it into a normalized table with the
columns ``id, problem, answer`` (+ ``solution`` when mapped) followed by the remaining source
fields, and a manifest recording what was used (source, revision, checksums, row count).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd

from pwopsd.io import sha256_file

NORMALIZED = ("id", "problem", "answer", "solution")


class DataError(ValueError):
    """A dataset could not be prepared; the message names the config key or the file."""


def _read_local(path: Path, key: str) -> pd.DataFrame:
    suffix = "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix
    try:
        if suffix in (".jsonl", ".jsonl.gz"):
            return pd.read_json(path, lines=True, dtype=False)
        if suffix == ".json":
            return pd.read_json(path, dtype=False)
        if suffix == ".csv":
            return pd.read_csv(path, dtype=str, keep_default_na=False)
        if suffix == ".parquet":
            return pd.read_parquet(path)
    except ValueError as exc:
        raise DataError(f"{key}: could not read {path}: {exc}") from None
    raise DataError(f"{key}: unsupported file type {path.suffix!r} for {path} (use .jsonl, .json, .csv or .parquet)")


def load_local(source: dict, key: str, base_dir: str | Path = ".") -> tuple[pd.DataFrame, dict]:
    path = Path(base_dir) / source["path"]
    if not path.is_file():
        raise DataError(f"{key}.path: file {path} does not exist")
    digest = sha256_file(path)
    expected = source.get("sha256")
    if expected and digest != expected:
        raise DataError(f"{key}.sha256: checksum mismatch for {path}: expected {expected}, got {digest}")
    return _read_local(path, key), {"kind": "local", "path": str(source["path"]), "sha256": digest, "sha256_verified": bool(expected)}


def _configure_offline(hub: dict) -> None:
    if hub.get("offline"):
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["HF_DATASETS_OFFLINE"] = "1"
        try:
            import datasets.config

            datasets.config.HF_HUB_OFFLINE = True
        except ImportError:
            pass


def load_hf(source: dict, key: str, hub: dict) -> tuple[pd.DataFrame, dict]:
    """Load a Hub dataset split at a pinned revision (honours HF_HUB_OFFLINE and the cache dir)."""
    _configure_offline(hub)
    import datasets

    try:
        ds = datasets.load_dataset(
            source["dataset"],
            source.get("config_name"),
            split=source["split"],
            revision=source["revision"],
            cache_dir=hub.get("cache_dir"),
        )
    except Exception as exc:  # datasets raises many types (connection, missing revision, ...)
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        hint = " (offline mode: is it in the cache?)" if offline else ""
        raise DataError(
            f"{key}: could not load Hub dataset {source['dataset']} split={source['split']} "
            f"revision={source['revision']}{hint}: {type(exc).__name__}: {exc}"
        ) from None
    files = [f["filename"] for f in ds.cache_files]
    prov = {
        "kind": "hf",
        "dataset": source["dataset"],
        "split": source["split"],
        "revision": source["revision"],
        "fingerprint": getattr(ds, "_fingerprint", None),
        "cache_files_sha256": {Path(f).name: sha256_file(f) for f in files},
        "datasets_version": datasets.__version__,
    }
    return ds.to_pandas(), prov


def load_tiny(source: dict) -> tuple[pd.DataFrame, dict]:
    from pwopsd.tiny.arithmetic import problems_frame, sample_problems

    def problems_of(spec: dict, exclude=frozenset()):
        return sample_problems(spec["seed"], spec["n"], list(spec["levels"]), spec.get("max_operand", 30),
                               spec.get("max_value"), exclude=exclude, distinct=bool(spec.get("distinct", False)))

    held_out = frozenset(p for other in source.get("held_out", []) for p in problems_of(other))
    try:
        problems = problems_of(source, held_out)
    except ValueError as exc:
        raise DataError(f"source (kind tiny, seed {source['seed']}): {exc}; lower n or drop source.held_out") from None
    prefix = "arith-" + "".join(str(lv) for lv in source["levels"]) + f"-s{source['seed']}"
    frame = problems_frame(problems, prefix, source.get("solution", "worked"), example=bool(source.get("example")))
    return frame, {"kind": "tiny", **{k: source[k] for k in sorted(source) if k != "kind"}}


def text_cells(values: pd.Series, key: str, field: str, column: str, where: str, ids: list | None = None) -> list[str]:
    """The cells of a text field as strings. A null (None, NaN, NA), a nested value (list, dict,
    array) or an empty string is a :class:`DataError` naming the source, the row and the column:
    ``str()`` would silently turn them into golds such as ``'nan'`` or prompts such as ``'None'``."""
    out = []
    for i, v in enumerate(values.tolist()):
        row = f"row {i}" + (f" (id {ids[i]!r})" if ids is not None else "")
        if isinstance(v, (list, tuple, dict, set)) or hasattr(v, "shape"):
            raise DataError(f"{key}: {where}, {row}, column {column!r} ({field}) is not a scalar: {str(v)[:80]!r}")
        if v is None or (not isinstance(v, str) and bool(pd.isna(v))):
            raise DataError(f"{key}: {where}, {row}, column {column!r} ({field}) is null")
        text = str(v)
        if not text.strip():
            raise DataError(f"{key}: {where}, {row}, column {column!r} ({field}) is empty")
        out.append(text)
    return out


def normalize(df: pd.DataFrame, columns: dict, key: str, where: str = "the source") -> pd.DataFrame:
    """Rename mapped columns to ``id, problem, answer[, solution]``; keep other fields after them.
    ``where`` names the source (file, Hub dataset) in error messages."""
    mapping = {"id": columns.get("id", "id"), "problem": columns.get("problem", "problem"),
               "answer": columns.get("answer", "answer"), "solution": columns.get("solution")}
    available = list(df.columns)
    for field, col in mapping.items():
        if col is not None and col not in df.columns:
            raise DataError(f"{key}.columns.{field}: column {col!r} not in the source (available: {', '.join(map(str, available))})")
    if len(df) == 0:
        raise DataError(f"{key}: {where} has no rows")
    out = pd.DataFrame()
    if mapping["id"] is not None:
        out["id"] = text_cells(df[mapping["id"]], key, "id", mapping["id"], where)
    else:
        out["id"] = [str(i) for i in range(len(df))]
    ids = list(out["id"])
    for field in ("problem", "answer", "solution"):
        if mapping[field] is not None:
            out[field] = text_cells(df[mapping[field]], key, field, mapping[field], where, ids)
    used = {c for c in mapping.values() if c is not None}
    for col in df.columns:
        if col not in used and col not in out.columns:
            values = df[col]
            # Keep scalar source fields; nested ones are stringified so parquet stays flat.
            if values.map(lambda v: isinstance(v, (list, dict))).any():
                values = values.map(str)
            out[col] = values.values
    if out["id"].duplicated().any():
        dup = out.loc[out["id"].duplicated(), "id"].iloc[0]
        raise DataError(f"{key}.columns.id: ids are not unique (e.g. {dup!r})")
    return out


def prepare_dataset(entry: dict, key: str, hub: dict | None = None, base_dir: str | Path = ".") -> tuple[pd.DataFrame, dict[str, Any]]:
    """Load, normalize and check one dataset entry; returns (table, manifest)."""
    source = entry["source"]
    kind = source["kind"]
    if kind == "hf":
        raw, prov = load_hf(source, f"{key}.source", hub or {})
    elif kind == "local":
        raw, prov = load_local(source, f"{key}.source", base_dir)
    elif kind == "tiny":
        raw, prov = load_tiny(source)
    else:  # the schema rejects this first
        raise DataError(f"{key}.source.kind: unknown kind {kind!r}")
    where = {"local": f"file {source.get('path')}", "hf": f"Hub dataset {source.get('dataset')} (split {source.get('split')})",
             "tiny": "the tiny generator"}.get(kind, "the source")
    df = normalize(raw, entry.get("columns", {}), key, where)
    expected = entry.get("expected_rows")
    if expected is not None and len(df) != expected:
        raise DataError(f"{key}.expected_rows: expected {expected} rows, the source has {len(df)}")
    first = entry.get("first_rows")
    if first is not None:  # a smoke run: the whole source was read and checked, its first rows are kept
        df = df.head(int(first)).reset_index(drop=True)
    manifest = {"name": key.split(".")[-1], "rows": len(df), "columns": list(df.columns), "source": prov,
                **({"first_rows": int(first)} if first is not None else {})}
    return df, manifest
