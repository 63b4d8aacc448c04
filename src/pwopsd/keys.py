"""What kept work is the work of: the keys of everything a job reuses across attempts.

A job that stops early keeps finished pieces for its next attempt: generation shards, graded
benchmark-seed pairs, the diagnostic's spines and forced continuations, training checkpoints. A
piece may be reused only by an attempt that would compute exactly the same piece, so each is kept
in a folder named by the fingerprint of a key that holds everything that determines it:

- the **weights** by content (:func:`weights_identity`): a Hub model's resolved commit and file
  checksums; a built or merged checkpoint's content hash, recorded in its manifest when it is
  written (:func:`content_sha256`). A path or a model name says nothing: retraining writes new
  weights to the same path;
- the **dtype**, the **backend** and its engine settings;
- the **code** that computes it (:func:`code_digest`: the sources of the package's modules the
  job's entry module imports, directly or not) and the library versions;
- the job's own settings and inputs (sampling, prompts, requests, grading options, ...).

:func:`part_key` assembles the common part; :func:`pwopsd.io.partial_dir` names the folder,
discards kept parts of another key and says in the log which fields changed (:func:`pwopsd.io.changed_fields`).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable

PACKAGE_ROOT = Path(__file__).resolve().parent

# Library versions that do not change what a job computes (the workflow engine; the package
# itself is covered by its sources, which the cluster's stacks import from the checkout).
NOT_RESULT_VERSIONS = ("pwopsd", "snakemake")


def _module_file(name: str) -> Path | None:
    """The source file of the package module ``name`` (``pwopsd.x.y``), or None (not a module of
    the package, or a name inside one: ``from pwopsd.x import y`` where ``y`` is a function)."""
    parts = name.split(".")
    if parts[0] != "pwopsd":
        return None
    base = PACKAGE_ROOT.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imported_modules(path: Path, module: str) -> set[str]:
    """Package modules that the source at ``path`` (module ``module``) imports anywhere in its body,
    function-level imports included (the package imports heavy libraries lazily)."""
    return set(_imports_of(path, path.stat().st_mtime_ns, module))


@functools.lru_cache(maxsize=None)
def _imports_of(path: Path, mtime_ns: int, module: str) -> frozenset[str]:
    """:func:`_imported_modules`, parsed once a process for each file version (``mtime_ns`` keys the
    cache): the Snakefile asks for the closure of every script, which share most modules."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return frozenset(m for m in found if m.startswith("pwopsd"))


@functools.lru_cache(maxsize=None)
def module_closure(*entries: str) -> tuple[str, ...]:
    """The package modules ``entries`` import, directly or through each other, entries and parent
    packages (whose ``__init__`` runs on import) included, sorted."""
    seen: dict[str, Path] = {}
    todo = list(entries)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = _module_file(name)
        if path is None:
            continue
        seen[name] = path
        parents = [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]
        todo.extend([*parents, *_imported_modules(path, name)])
    missing = [e for e in entries if e not in seen]
    if missing:
        raise ValueError(f"not modules of the package: {', '.join(missing)}")
    return tuple(sorted(seen))


def _without_docstrings(tree: ast.AST) -> ast.AST:
    """``tree`` with the docstring of every module, class and function removed (in place)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


@functools.lru_cache(maxsize=None)
def behaviour_text(path: Path, mtime_ns: int) -> str:
    """What a module does, as text: its syntax tree without docstrings, comments, line numbers or
    layout (``ast.dump``). A comment, a docstring or a reflowed line leaves it as it was; any change
    of what runs changes it. (``mtime_ns`` keys the cache.)"""
    return ast.dump(_without_docstrings(ast.parse(path.read_text(), str(path))), include_attributes=False)


def module_behaviour(name: str) -> str:
    path = _module_file(name)
    return behaviour_text(path, path.stat().st_mtime_ns)


def code_digest(*entries: str) -> str:
    """SHA-256 of what every package module the entry modules import (directly or not) does
    (:func:`behaviour_text`): what changes when the code that computes a kept part changes, and
    not when a comment or a docstring does (issue 51: a comment appended to ``runtime.py`` used to
    restart every training at step 0). Read from the files the job imports (the checkout on the
    cluster, where pwopsd is not installed and has no version)."""
    h = hashlib.sha256()
    for name in module_closure(*entries):
        h.update(name.encode() + b"\0" + module_behaviour(name).encode() + b"\0")
    return h.hexdigest()


def script_code_digest(script: str | os.PathLike) -> str | None:
    """The :func:`code_digest` of the package modules a workflow script imports (directly or not),
    shortened; None for a script that imports none. A rule param holding it reruns the rule's
    finished jobs when the code that computed them changes (the Snakefile adds it to every rule;
    Snakemake's own code trigger sees the script file only)."""
    path = Path(script)
    entries = sorted(m for m in _imported_modules(path, "__main__") if _module_file(m) is not None)
    return code_digest(*entries)[:16] if entries else None


def code_digests(*entries: str) -> dict[str, str]:
    """``{module: short digest of what it does}`` over the modules :func:`code_digest` covers:
    recorded beside kept work, so that a changed key names the modules that changed."""
    return {name: hashlib.sha256(module_behaviour(name).encode()).hexdigest()[:12] for name in module_closure(*entries)}


def folder_files_sha256(root: str | os.PathLike) -> dict[str, str]:
    """SHA-256 of every file of a checkpoint folder, by relative path (hidden files left out:
    Snakemake's time stamps in ``directory()`` outputs)."""
    from pwopsd.io import sha256_file

    root = Path(root)
    return {str(f.relative_to(root)): sha256_file(f) for f in sorted(root.rglob("*"))
            if f.is_file() and not any(p.startswith(".") for p in f.relative_to(root).parts)}


def content_sha256(files: dict[str, str]) -> str:
    """One hash of a folder's ``{relative path: sha256}``."""
    return hashlib.sha256("".join(f"{k}\0{v}\n" for k, v in sorted(files.items())).encode()).hexdigest()


def folder_content_sha256(root: str | os.PathLike) -> str:
    """A checkpoint folder's content hash: what a built or merged checkpoint's manifest records as
    its identity when it is written (``content_sha256``, read by :func:`weights_identity`)."""
    return content_sha256(folder_files_sha256(root))


def weights_identity(manifest: dict) -> dict:
    """What determines a checkpoint's weights and tokenizer files: a Hub model's id, pinned revision,
    resolved commit and file checksums; a built or merged one's content hash from its manifest; any
    other, the hash of its folder's files now."""
    from pwopsd.models import ModelError

    if manifest.get("files_sha256"):
        return {"hf_id": manifest.get("hf_id"), "revision": manifest.get("revision"),
                "resolved_commit": manifest.get("resolved_commit"), "files": manifest["files_sha256"]}
    if manifest.get("content_sha256"):
        return {"content_sha256": manifest["content_sha256"]}
    root = Path(manifest["path"])
    if not root.is_dir():
        raise ModelError(f"model {manifest.get('model')}: checkpoint directory {root} does not exist")
    return {"content_sha256": folder_content_sha256(root)}


def result_versions() -> dict[str, str]:
    """Versions of the libraries that can change a computed piece (see :data:`NOT_RESULT_VERSIONS`);
    Python's as major.minor (a patch release changes no result of ours)."""
    from pwopsd.runtime import versions

    out = {k: v for k, v in versions().items() if k not in NOT_RESULT_VERSIONS}
    if "python" in out:
        out["python"] = ".".join(out["python"].split(".")[:2])
    return out


def part_key(manifest: dict | None, *, code: Iterable[str], dtype: str | None = None, backend: str | None = None,
             engine: dict | None = None, **what: Any) -> dict:
    """The key of a kept part: the weights' identity, dtype, backend and engine settings, the code of
    the ``code`` entry modules, library versions, and ``what`` (the job's own settings and inputs)."""
    return {"weights": None if manifest is None else weights_identity(manifest), "dtype": dtype, "backend": backend,
            "engine": engine, "code": code_digest(*code), "versions": result_versions(), **what}
