"""The code params of the Snakefile's rules, remembered between Snakemake starts.

Every rule that runs a script carries the digest of what the package modules its script imports
do (:func:`pwopsd.keys.script_code_digest`). Computing them parses every module of the package
twice: about 1 s of each Snakemake start, a dry run's included, and of every cluster job's own
start. :func:`script_code_digests` keeps them in a file (``.snakemake/pwopsd/code_digests.json``
in the checkout, beside the Snakefile: one for every working directory) under the SHA-256 of the
package's sources, of each script and of Python's version (which ``ast.dump`` follows): a changed
source is another key, so the file can only ever answer what parsing would.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Iterable

from pwopsd import keys

PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"  # ast.dump's output follows it


def package_fingerprint(root: Path | None = None) -> str:
    """SHA-256 of the package's Python sources (each file's path and bytes) and Python's version."""
    root = keys.PACKAGE_ROOT if root is None else root
    h = hashlib.sha256(f"python {PYTHON}\n".encode())
    for path in sorted(root.rglob("*.py")):
        h.update(f"{path.relative_to(root).as_posix()}\0".encode() + hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def script_code_digests(scripts: Iterable[str | os.PathLike], cache: str | os.PathLike) -> dict[str, str | None]:
    """``{str(script): script_code_digest(script)}``, read from ``cache`` (a JSON file) where the
    package's sources and the script's bytes are those it was computed from. The file holds one
    package version's digests (a changed module replaces them all); an unreadable file is ignored
    and one that cannot be written is left as it is."""
    scripts = [str(s) for s in scripts]
    cache, package = Path(cache), package_fingerprint()
    try:
        data = json.loads(cache.read_text())
    except (OSError, ValueError):
        data = None
    ours = isinstance(data, dict) and data.get("package") == package and isinstance(data.get("digests"), dict)
    known = data["digests"] if ours else {}
    out, used = {}, {}
    for script in scripts:
        key = hashlib.sha256(Path(script).read_bytes()).hexdigest()
        used[key] = out[script] = known[key] if key in known else keys.script_code_digest(script)
    if used != known:
        from pwopsd.io import atomic_path

        try:
            with atomic_path(cache) as tmp:
                tmp.write_text(json.dumps({"package": package, "digests": used}, sort_keys=True))
        except OSError:  # a read-only checkout: the next start parses again
            pass
    return out
