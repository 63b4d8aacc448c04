"""A digest of a run's results: every number behind its tables, figures and report, in one
canonical JSON file, so that CI can tell when any number moved.

The digest of tiny mode is committed as ``tiny/digest.json`` (the tiny run writes ``tiny/results``);
after a change that is meant to move numbers, rewrite it with::

    python -m pwopsd.report.digest tiny/results --update tiny/digest.json

and ``--check`` instead of ``--update`` says (exit status 1) which numbers moved.

What it holds, as ``{artifact: {row key: value}}`` (the artifact is the file's path under the
results folder without its extension):

* every table (``tables/*.csv``; Tables 1-5, significance, sweep) and every figure's plotted data
  (``figures/*.csv``, written beside each PDF), the aggregated metrics (``metrics/summary.csv``,
  ``metrics/per_seed.csv``) and the reproduction report (``report/reproduction.csv``,
  ``report/reproduction_figure.csv``): one entry per CSV row, keyed by its identifying columns
  joined with ``|`` (:data:`KEY_COLUMNS`; by default the columns that are not numbers), holding
  ``{column: value}`` of its numeric and boolean columns; other text columns (LaTeX labels, ...)
  are left out;
* what the figures are drawn from beyond their CSV: the diagnostic's ``branch_auroc.json`` and
  ``fitted_schedule.json`` and the training logs (``training/<model>/<run>/train_log.jsonl``,
  one row per step), flattened to dotted paths;
* the tiny model's build report (``models/<model>/build_report.json``: pretraining steps, dev
  accuracies and checks, final loss).

Not in it: timings (any key with ``seconds``, ``time``, ``duration``, ...), settings (inputs, not
results), versions, paths, hosts, dates, provenance files, LaTeX and PDF renderings (drawn from the
CSVs above), per-problem metric files, parquet files.

Floats are stored as Python writes them (``repr``: the shortest text that reads back as the same
double), so equal digests mean bit-equal numbers as the result files hold them. Non-finite floats
are stored as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``; empty CSV cells as ``null``.
"""

from __future__ import annotations

import argparse
import csv
import fnmatch
import json
import math
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from pwopsd.io import ResultFileError, atomic_path

TINY_RESULTS = "tiny/results"
TINY_DIGEST = "tiny/digest.json"
UPDATE_EXAMPLE = f"python -m pwopsd.report.digest {TINY_RESULTS} --update {TINY_DIGEST}"

# Identifying columns of the CSVs whose keys are not (only) their text columns, by artifact pattern
# (first match wins). Every other CSV is keyed by its columns that are not numbers or booleans.
KEY_COLUMNS: list[tuple[str, tuple[str, ...]]] = [
    ("tables/significance_*", ("model", "method", "baseline", "metric", "benchmark")),
    ("figures/deltas_*", ("model", "method", "baseline", "metric", "benchmark")),
    ("tables/sweep_*", ("model", "method", "metric", "benchmark", "step")),
    ("figures/sweep_*", ("model", "method", "metric", "benchmark", "step")),
    ("tables/branch_auroc", ("score",)),
    ("figures/branch_auroc", ("panel", "series", "bin", "center")),
    ("figures/branch_auroc_scatter", ("dataset", "problem_id", "candidate")),
    ("figures/pwopsd_schedules", ("r",)),
    ("figures/training_curves_*", ("run", "step")),
    ("metrics/per_seed", ("model", "checkpoint", "benchmark", "seed", "metric")),
    ("metrics/summary", ("model", "checkpoint", "benchmark", "metric")),
    ("report/reproduction", ("paper_table", "model", "method", "benchmark", "metric")),
    ("report/reproduction_figure", ("model", "method", "benchmark", "metric")),
]

# CSV files every finished run has, besides one CSV per table (tables/*.tex) and per figure
# (figures/*.pdf).
REQUIRED_CSV = ("metrics/summary.csv", "metrics/per_seed.csv", "report/reproduction.csv",
                "report/reproduction_figure.csv")
# A figure PDF whose data CSV is not named after it.
FIGURE_DATA = {"report/reproduction.pdf": "report/reproduction_figure.csv"}

# Keys (JSON keys, CSV columns) that are not results: inputs, environment, timings.
SKIP_KEYS = {"provenance", "versions", "version", "settings", "cpu_capability", "pinned_kernel_path", "cpu_matmul", "mkl_cbwr", "device", "devices",
             "host", "hostname", "node", "path", "paths", "date", "created", "timestamp", "started", "finished"}
_TIMING = re.compile(r"(^|_)(seconds?|secs?|time|times|timing|wall|elapsed|duration|timestamp|date|hostname|"
                     r"throughput|per_second|it_s|tokens_per_s)($|_)", re.IGNORECASE)
# Fields that identify the records of a JSON list (used as the key instead of the index).
ID_FIELDS = ("score", "step", "name", "id", "run", "problem_id")
# Artifacts first by what a reader looks at first: tables, report, figures, then their inputs.
_ORDER = {"tables": 0, "report": 1, "figures": 2, "diagnostic": 3, "models": 4, "metrics": 5, "training": 6}


class DigestError(ResultFileError):
    """A results folder lacks a file the digest expects, or a file cannot be read."""


def is_skipped(key: str) -> bool:
    """Whether a JSON key or CSV column is not a result (timing, setting, version, path, ...)."""
    return key.lower() in SKIP_KEYS or bool(_TIMING.search(key))


def _scalar(value: Any) -> Any:
    """A JSON-able number: non-finite floats become strings (the digest stays strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


_INT = re.compile(r"^[+-]?\d+$")
_BOOLS = {"True": True, "False": False, "true": True, "false": False}


def _parse_cell(text: str) -> tuple[bool, Any]:
    """(is a value, value) of one CSV cell: numbers, booleans and empty cells are values."""
    text = text.strip()
    if text == "":
        return True, None
    if text in _BOOLS:
        return True, _BOOLS[text]
    if _INT.match(text):
        return True, int(text)
    try:
        return True, _scalar(float(text))
    except ValueError:
        return False, text


def _key_columns(name: str) -> tuple[str, ...] | None:
    for pattern, cols in KEY_COLUMNS:
        if fnmatch.fnmatchcase(name, pattern):
            return cols
    return None


def _unique(rows: dict, key: str) -> str:
    """``key``, or ``key#2``, ``key#3``, ... when rows already holds it (a log with a step twice)."""
    if key not in rows:
        return key
    n = 2
    while f"{key}#{n}" in rows:
        n += 1
    return f"{key}#{n}"


def read_csv(path: Path, name: str) -> dict[str, dict[str, Any]]:
    """One CSV as ``{row key: {column: value}}`` (see the module docstring)."""
    try:
        with open(path, newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            body = [row for row in reader if row]
    except FileNotFoundError:
        raise DigestError(f"{path}: file does not exist") from None
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DigestError(f"{path}: not a readable CSV file ({exc})") from None
    if not header:
        raise DigestError(f"{path}: empty CSV file (no header); delete it so that the job writing it runs again")
    for i, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise DigestError(f"{path}: line {i} has {len(row)} cells, the header {len(header)}")
    parsed = [[_parse_cell(cell) for cell in row] for row in body]
    numeric = [all(p[j][0] for p in parsed) for j in range(len(header))]
    keys = _key_columns(name)
    if keys is None:
        key_idx = [j for j, c in enumerate(header) if not numeric[j]]
    else:
        missing = [c for c in keys if c not in header]
        if missing:
            raise DigestError(f"{path}: no column {', '.join(missing)} (the digest keys {name} by "
                              f"{', '.join(keys)}; see pwopsd.report.digest.KEY_COLUMNS)")
        key_idx = [header.index(c) for c in keys]
    value_idx = [j for j, c in enumerate(header) if j not in key_idx and numeric[j] and not is_skipped(c)]
    out: dict[str, dict[str, Any]] = {}
    for row, cells in zip(body, parsed):
        key = _unique(out, "|".join(row[j].strip() for j in key_idx))
        out[key] = {header[j]: cells[j][1] for j in value_idx}
    return out


def _record_ids(items: list) -> str | None:
    """The field identifying the records of a JSON list of objects, if one does."""
    if not items or not all(isinstance(x, dict) for x in items):
        return None
    for field in ID_FIELDS:
        values = [x.get(field) for x in items]
        if all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in values) \
                and len(set(map(str, values))) == len(values):
            return field
    return None


def flatten(obj: Any, prefix: str = "", out: dict[str, Any] | None = None) -> dict[str, Any]:
    """The numbers, booleans and nulls of a JSON value as ``{dotted path: value}``; text is left
    out, and so are keys that are not results (:func:`is_skipped`). Lists of objects are keyed by
    their identifying field (``scores[score=h_full].auroc``), other lists by index (``curve.w[3]``)."""
    out = {} if out is None else out
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not is_skipped(str(k)):
                flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(obj, list):
        field = _record_ids(obj)
        for i, item in enumerate(obj):
            if field is not None:
                rest = {k: v for k, v in item.items() if k != field}
                flatten(rest, f"{prefix}[{field}={item[field]}]", out)
            else:
                flatten(item, f"{prefix}[{i}]", out)
    elif obj is None or isinstance(obj, (bool, int, float)):
        out[prefix] = _scalar(obj)
    return out


def read_json_values(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise DigestError(f"{path}: file does not exist") from None
    try:
        return flatten(json.loads(text))
    except json.JSONDecodeError as exc:
        raise DigestError(f"{path}: not valid JSON ({exc}); delete it so that the job writing it runs again") from None


def read_jsonl(path: Path) -> dict[str, dict[str, Any]]:
    """A JSON-lines log as ``{step: {field: value}}`` (line number when a record has no step)."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise DigestError(f"{path}: file does not exist") from None
    out: dict[str, dict[str, Any]] = {}
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DigestError(f"{path}: line {n} is not valid JSON ({exc})") from None
        if not isinstance(record, dict):
            raise DigestError(f"{path}: line {n} is not a JSON object")
        step = record.get("step")
        key = str(step) if isinstance(step, int) and not isinstance(step, bool) else f"line{n}"
        out[_unique(out, key)] = flatten({k: v for k, v in record.items() if k != "step"})
    return out


def _name(path: Path, root: Path) -> str:
    return path.relative_to(root).with_suffix("").as_posix()


def _need(path: Path, why: str) -> Path:
    if not path.is_file():
        raise DigestError(f"{path}: file does not exist ({why})")
    return path


def expected_files(results_dir: str | Path) -> dict[str, tuple[str, Path]]:
    """``{artifact name: (kind, path)}`` of every file the digest reads, kind one of ``csv``,
    ``json``, ``jsonl``; raises :class:`DigestError` naming the first expected file that is missing."""
    root = Path(results_dir)
    if not root.is_dir():
        raise DigestError(f"{root}: no such results folder")
    files: dict[str, tuple[str, Path]] = {}

    def add(kind: str, path: Path) -> None:
        files[_name(path, root)] = (kind, path)

    tables = sorted((root / "tables").glob("*.tex")) + sorted((root / "tables").glob("*.csv"))
    if not tables:
        raise DigestError(f"{root / 'tables'}: no tables (tables/*.csv); is {root} a finished run's results folder?")
    for tex in sorted((root / "tables").glob("*.tex")):
        add("csv", _need(tex.with_suffix(".csv"), f"the values of table {tex.name}"))
    for table in sorted((root / "tables").glob("*.csv")):
        add("csv", table)
    for pdf in sorted((root / "figures").glob("*.pdf")) + sorted((root / "report").glob("*.pdf")):
        rel = pdf.relative_to(root).as_posix()
        data = root / FIGURE_DATA.get(rel, pdf.with_suffix(".csv").relative_to(root).as_posix())
        add("csv", _need(data, f"the data of figure {rel}"))
    for csv_file in sorted((root / "figures").glob("*.csv")):
        add("csv", csv_file)
    for rel in REQUIRED_CSV:
        add("csv", _need(root / rel, "every finished run has it"))
    # the training logs that the training-curve figures are drawn from
    for curves in sorted((root / "figures").glob("training_curves_*.csv")):
        model = curves.stem[len("training_curves_"):]
        for run in _curve_runs(curves):
            add("jsonl", _need(root / "training" / model / run / "train_log.jsonl",
                               f"figures/{curves.name} plots run {run}"))
    for log in sorted((root / "training").glob("*/*/train_log.jsonl")):
        add("jsonl", log)
    for folder in sorted(p for p in (root / "diagnostic").glob("*") if p.is_dir()):
        add("json", _need(folder / "branch_auroc.json", f"the diagnostic of {folder.name} (Table 1)"))
        if (folder / "fitted_schedule.json").is_file():
            add("json", folder / "fitted_schedule.json")
    for base in sorted((root / "models").glob("*/base.json")):
        try:
            kind = json.loads(base.read_text()).get("kind")
        except (OSError, ValueError, AttributeError):
            raise DigestError(f"{base}: not a readable model manifest") from None
        if kind == "tiny":
            add("json", _need(base.parent / "build_report.json", f"model {base.parent.name} is built by the workflow"))
    return files


def _curve_runs(curves: Path) -> list[str]:
    try:
        with open(curves, newline="") as fh:
            reader = csv.DictReader(fh)
            if "run" not in (reader.fieldnames or []):
                raise DigestError(f"{curves}: no column run")
            return list(dict.fromkeys(row["run"] for row in reader))
    except FileNotFoundError:
        raise DigestError(f"{curves}: file does not exist") from None


def collect(results_dir: str | Path) -> dict[str, dict[str, Any]]:
    """Every number of a run's results: ``{artifact: {row key: value}}`` (module docstring)."""
    out: dict[str, dict[str, Any]] = {}
    for name, (kind, path) in sorted(expected_files(results_dir).items()):
        if kind == "csv":
            out[name] = read_csv(path, name)
        elif kind == "jsonl":
            out[name] = read_jsonl(path)
        else:
            out[name] = read_json_values(path)
    return out


def count_values(d: dict) -> int:
    """How many numbers (leaves) a digest holds."""
    return sum(len(_leaves(rows)) for name, rows in d.items() if name != PLATFORM)


def digest_text(d: dict) -> str:
    """The canonical text of a digest: sorted keys, one value per line, floats as ``repr``."""
    return json.dumps(d, sort_keys=True, indent=1, allow_nan=False, ensure_ascii=True) + "\n"


PLATFORM = "_platform"  # the writing host's numeric platform: a record beside the numbers, never compared


def write_digest(results_dir: str | Path, path: str | Path, platform: dict | None = None) -> dict:
    """Collect the digest of ``results_dir`` and write it to ``path`` (atomically), with the numeric
    platform of the host that writes it (:func:`pwopsd.runtime.numeric_platform`); returns it."""
    from pwopsd.runtime import numeric_platform

    d = {**collect(results_dir), PLATFORM: platform if platform is not None else numeric_platform()}
    text = digest_text(d)
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return d


def read_digest(path: str | Path) -> dict:
    path = Path(path)
    try:
        d = json.loads(path.read_text())
    except FileNotFoundError:
        raise DigestError(f"{path}: file does not exist") from None
    except json.JSONDecodeError as exc:
        raise DigestError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(d, dict) or not all(isinstance(v, dict) for v in d.values()):
        raise DigestError(f"{path}: not a digest ({{artifact: {{row: value}}}})")
    return d


def _leaves(rows: dict) -> dict[tuple[str, str | None], Any]:
    """``{(row, column or None): value}`` of one artifact."""
    out = {}
    for row, value in rows.items():
        if isinstance(value, dict):
            for col, v in value.items():
                out[(row, col)] = v
        else:
            out[(row, None)] = value
    return out


def _same(a: Any, b: Any) -> bool:
    """Equal as stored: same type and value; floats by their exact text (-0.0 differs from 0.0)."""
    if type(a) is not type(b):
        return False
    return repr(a) == repr(b) if isinstance(a, float) else a == b


def _fmt(v: Any) -> str:
    return "null" if v is None else repr(v)


def _label(row: str, col: str | None) -> str:
    return row if col is None else f"{row} {col}"


def _order(name: str) -> tuple:
    return (_ORDER.get(name.split("/", 1)[0], len(_ORDER)), name)


def compare(old: dict, new: dict, limit: int = 40) -> list[str]:
    """What differs from ``old`` to ``new``: one line per moved value (``tables/main_4b:
    tiny_qwen3|opsd|mean|avg mean 29.69 -> 30.12``), per row or artifact that appeared or
    disappeared; at most ``limit`` lines and ``... and N more``. Empty when they are identical."""
    lines: list[str] = []
    for name in sorted((set(old) | set(new)) - {PLATFORM}, key=_order):
        if name not in new:
            lines.append(f"{name}: disappeared ({len(_leaves(old[name]))} values)")
            continue
        if name not in old:
            lines.append(f"{name}: appeared ({len(_leaves(new[name]))} values)")
            continue
        a, b = old[name], new[name]
        for row in sorted(set(a) | set(b)):
            if row not in b and isinstance(a[row], dict):
                lines.append(f"{name}: row {row} disappeared")
                continue
            if row not in a and isinstance(b[row], dict):
                lines.append(f"{name}: row {row} appeared")
                continue
            la, lb = _leaves({row: a[row]} if row in a else {}), _leaves({row: b[row]} if row in b else {})
            for key in sorted(set(la) | set(lb), key=lambda k: (k[0], k[1] or "")):
                if key not in lb:
                    lines.append(f"{name}: {_label(*key)} disappeared (was {_fmt(la[key])})")
                elif key not in la:
                    lines.append(f"{name}: {_label(*key)} appeared ({_fmt(lb[key])})")
                elif not _same(la[key], lb[key]):
                    lines.append(f"{name}: {_label(*key)} {_fmt(la[key])} -> {_fmt(lb[key])}")
    if len(lines) > limit:
        lines = lines[:limit] + [f"... and {len(lines) - limit} more"]
    return lines


def platform_lines(old: dict, here: dict | None = None) -> list[str]:
    """The digest's numeric platform beside this host's, the differing fields marked: told with
    every failed check, so that a number moved by a new CPU kind or library is told apart from one
    moved by a change of code."""
    from pwopsd.runtime import numeric_platform

    here = numeric_platform() if here is None else here
    then = old.get(PLATFORM) or {}
    lines = ["numeric platform: the digest's (written) -> this host's; * marks a difference"]
    for key in sorted(set(then) | set(here)):
        a, b = then.get(key), here.get(key)
        lines.append(f"  {'*' if a != b else ' '} {key}: {a} -> {b}" if a != b else f"    {key}: {a}")
    if not then:
        lines.append("  (the digest records no platform: written before it was recorded)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pwopsd.report.digest",
        description="Every number of a run's results (tables, figure data, build report) as one canonical JSON "
                    "file; --check says which numbers moved since the committed digest, --update rewrites it.",
        epilog=f"example (tiny mode, after a change meant to move numbers):\n  {UPDATE_EXAMPLE}\n"
               f"check (exit 0: identical, 1: numbers moved, 2: a file is missing or unreadable):\n"
               f"  python -m pwopsd.report.digest {TINY_RESULTS} --check {TINY_DIGEST}",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results_dir", metavar="RESULTS_DIR",
                        help=f"a finished run's results folder (tiny mode: {TINY_RESULTS})")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", metavar="DIGEST_JSON", nargs="?", const=TINY_DIGEST,
                      help=f"compare with this digest (default {TINY_DIGEST}); exit 1 when any number moved")
    mode.add_argument("--update", metavar="DIGEST_JSON", nargs="?", const=TINY_DIGEST,
                      help=f"(re)write this digest (default {TINY_DIGEST})")
    parser.add_argument("--limit", type=int, default=40, help="at most this many lines of differences (default 40)")
    args = parser.parse_args(argv)
    try:
        if args.update is not None:
            d = write_digest(args.results_dir, args.update)
            print(f"{args.update}: {count_values(d)} values of {len(d) - 1} files of {args.results_dir}, written on "
                  f"{d[PLATFORM]['vendor']} {d[PLATFORM]['model_name']}")
            return 0
        update = f"python -m pwopsd.report.digest {shlex.quote(args.results_dir)} --update {shlex.quote(args.check)}"
        new = collect(args.results_dir)
        if not Path(args.check).is_file():
            print(f"{args.check}: no digest to check against; write it with:\n  {update}", file=sys.stderr)
            return 1
        old = read_digest(args.check)
    except ResultFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    moved = compare(old, new, limit=args.limit)
    if not moved:
        print(f"{args.results_dir} matches {args.check} ({count_values(new)} values)")
        return 0
    print(f"{args.results_dir} differs from {args.check}:")
    for line in moved:
        print(f"  {line}")
    for line in platform_lines(old):
        print(line)
    print(f"If these changes are intended, update the digest with:\n  {update}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
