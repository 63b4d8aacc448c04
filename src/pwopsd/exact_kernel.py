"""The rounding of :mod:`pwopsd.exact_matmul` compiled: one pass over the factor instead of about
fifteen torch operations, for the small products of a decode step where those operations' overhead
is most of the cost (``benchmarks/exact_matmul.py``).

Every step of :data:`SOURCE` is an exact IEEE operation or the one rounding to the nearest even
integer that :func:`pwopsd.exact_matmul.rounded64` makes, in the same order for each value: the
bits are the same (``tests/test_exact_matmul.py`` compares the two on every shape, layout and
special value), only the loops differ. So the compiled kernel is a matter of speed, never of
results: a machine without a C compiler runs the torch path and gets the same run.

Built on first use with the machine's C compiler (``$CC``, else ``cc``) for the host's instruction
set (``-march=native``; the baseline one where the compiler refuses it), without fast-math and
without contraction (either could change a rounding), into ``$PWOPSD_KERNEL_DIR`` (default
``~/.cache/pwopsd``) under a name keyed by the source, the compiler's version and flags and the
CPU's flags (a home folder shared by other CPUs keeps one build each); written atomically, so
concurrent jobs can race to build it.
``PWOPSD_EXACT_KERNEL=torch`` turns it off (tests, benchmarks).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch

ENV = "PWOPSD_EXACT_KERNEL"  # "c" (default: the compiled rounding where it builds) or "torch"
DIR_ENV = "PWOPSD_KERNEL_DIR"
FLAGS = ("-O3", "-fPIC", "-shared", "-fno-fast-math", "-ffp-contract=off", "-fno-math-errno")
NATIVE = "-march=native"  # the host's vector width (the bits do not depend on it); keyed by the host's CPU flags

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* 2**n for n within float64's normal exponents, from its bits (as pwopsd.exact_matmul.pow2). */
static double pow2(int n) {
    uint64_t bits = (uint64_t)(n + 1023) << 52;
    double v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* rint(v) (to the nearest integer, ties to even, the sign of a zero kept), in a form a compiler
 * vectorizes: below 2**52, adding and taking away 2**52 rounds |v| exactly once; from 2**52 on (and
 * for infinities and NaN) v is its own rounding. Both are computed and one is kept by a mask on the
 * magnitude's bits (they order as magnitudes do, NaN's above infinity's): a floating-point compare
 * or a conditional would be control flow that GCC does not vectorize without -fno-trapping-math
 * (the rounding of a 1200x384 factor took 0.63 ms so, 0.25 ms vectorized). */
static inline double round_even(double v) {
    const double two52 = 4503599627370496.0;
    double r = copysign((fabs(v) + two52) - two52, v);
    uint64_t bits, rounded;
    memcpy(&bits, &v, sizeof bits);
    memcpy(&rounded, &r, sizeof rounded);
    uint64_t keep = -(uint64_t)((bits & 0x7fffffffffffffffull) < 0x4330000000000000ull);
    bits = (rounded & keep) | (bits & ~keep);
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* The magnitude's bits of a float32 (its bits without the sign): for numbers and infinities they
 * order as the magnitudes do, and a NaN's lie above infinity's, so an integer maximum (which a
 * compiler vectorizes, unlike a float one that must keep NaN) gives the largest magnitude, or NaN. */
static inline uint32_t magnitude(const float *x) {
    uint32_t bits;
    memcpy(&bits, x, sizeof bits);
    return bits & 0x7fffffffu;
}

/* The group's scale 2**(beta - e) and its (exact) reciprocal, e from frexp of its largest magnitude
 * (NaN where a value of the group is NaN, as torch's amax and maximum give it). */
static void scale_of(uint32_t largest, int beta, double *scale, double *recip) {
    float m;
    int e = 0;
    memcpy(&m, &largest, sizeof m);
    frexpf(m, &e);
    *scale = pow2(beta - e);
    *recip = 1.0 / *scale;
}

/* x: `batch` row-major matrices of rows x cols float32, `sb` apart; out: the same, contiguous, in
 * float64. per_row: each row has its scale (a left factor, rounded along dim -1); else each column
 * (a right factor, along dim -2). Returns 0, or -1 when out of memory. */
int pwopsd_round(const float *x, double *out, int64_t batch, int64_t rows, int64_t cols, int64_t sb,
                 int beta, int per_row) {
    size_t groups = (size_t)(per_row ? 1 : cols) + 1;  /* a right factor's column scales */
    double *scale = malloc(sizeof(double) * groups), *recip = malloc(sizeof(double) * groups);
    uint32_t *largest = malloc(sizeof(uint32_t) * groups);
    if (!scale || !recip || !largest) {
        free(scale); free(recip); free(largest);
        return -1;
    }
    for (int64_t b = 0; b < batch; b++) {
        const float *xb = x + b * sb;
        double *ob = out + b * rows * cols;
        if (per_row) {
            for (int64_t i = 0; i < rows; i++) {
                const float *xi = xb + i * cols;
                double *oi = ob + i * cols;
                uint32_t m = 0;
                for (int64_t j = 0; j < cols; j++) {
                    uint32_t a = magnitude(xi + j);
                    m = a > m ? a : m;
                }
                double s, r;
                scale_of(m, beta, &s, &r);
                for (int64_t j = 0; j < cols; j++) oi[j] = round_even((double)xi[j] * s) * r;
            }
        } else {
            memset(largest, 0, sizeof(uint32_t) * (size_t)cols);
            for (int64_t i = 0; i < rows; i++) {
                const float *xi = xb + i * cols;
                for (int64_t j = 0; j < cols; j++) {
                    uint32_t a = magnitude(xi + j);
                    largest[j] = a > largest[j] ? a : largest[j];
                }
            }
            for (int64_t j = 0; j < cols; j++) scale_of(largest[j], beta, &scale[j], &recip[j]);
            for (int64_t i = 0; i < rows; i++) {
                const float *xi = xb + i * cols;
                double *oi = ob + i * cols;
                for (int64_t j = 0; j < cols; j++) oi[j] = round_even((double)xi[j] * scale[j]) * recip[j];
            }
        }
    }
    free(scale); free(recip); free(largest);
    return 0;
}

/* The elementwise functions of pwopsd.exact_elementwise, in its order (UNARY): the C library's
 * double-precision functions, called one value at a time through a pointer (so the compiler can
 * neither inline nor vectorize them), a float32 value widened exactly and the result rounded once. */
typedef double (*unary_fn)(double);
static const unary_fn UNARY[] = {acos, asin, atan, cos, erf, erfc, exp, log, log10, log2, sin, sqrt, tan,
                                 tanh, trunc};

/* out[i] = f(x[i]) for n contiguous values, float64 (is_double) or float32; -1 for an unknown op. */
int pwopsd_unary(int op, const void *x, void *out, int64_t n, int is_double) {
    if (op < 0 || op >= (int)(sizeof UNARY / sizeof UNARY[0])) return -1;
    unary_fn f = UNARY[op];
    if (is_double) {
        const double *a = x;
        double *o = out;
        for (int64_t i = 0; i < n; i++) o[i] = f(a[i]);
    } else {
        const float *a = x;
        float *o = out;
        for (int64_t i = 0; i < n; i++) o[i] = (float)f((double)a[i]);
    }
    return 0;
}
"""

_state: dict = {}


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc"))


def _cpu_flags() -> str:
    """The host's instruction-set flags (Linux), so that a build for one CPU is not loaded on another
    from a shared home folder."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def library_path(compiler: str) -> Path:
    """Where the build for this source, compiler, flags and host lives."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256("\0".join([SOURCE, version, *FLAGS, NATIVE, platform.machine(), _cpu_flags()]).encode())
    root = Path(os.environ.get(DIR_ENV) or Path.home() / ".cache" / "pwopsd")
    return root / f"exact_rounding-{key.hexdigest()[:16]}.so"


def build(compiler: str) -> Path:
    """The shared library, compiled if it is not there yet (atomically: a concurrent build of the
    same key writes the same file); for the host's instruction set where the compiler can, else for
    the baseline one."""
    path = library_path(compiler)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        source = Path(tmp) / "exact_rounding.c"
        source.write_text(SOURCE)
        out = Path(tmp) / path.name
        for flags in ((*FLAGS, NATIVE), FLAGS):
            proc = subprocess.run([compiler, *flags, "-o", str(out), str(source), "-lm"], capture_output=True, text=True)
            if proc.returncode == 0:
                break
        else:
            raise subprocess.CalledProcessError(proc.returncode, proc.args, proc.stdout, proc.stderr)
        os.replace(out, path)
    return path


def _library():
    """The compiled library, or None (turned off, no compiler, or the build failed: warned once)."""
    choice = os.environ.get(ENV, "c")
    if choice not in ("c", "torch"):
        raise ValueError(f"{ENV}={choice!r}: expected c or torch")
    if choice == "torch":
        return None
    if "lib" not in _state:
        lib = None
        compiler = _compiler()
        if compiler is not None:
            try:
                lib = ctypes.CDLL(str(build(compiler)))
                lib.pwopsd_round.restype = ctypes.c_int
                lib.pwopsd_round.argtypes = [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int64] * 4 + [ctypes.c_int] * 2
                lib.pwopsd_unary.restype = ctypes.c_int
                lib.pwopsd_unary.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
            except (OSError, subprocess.CalledProcessError) as exc:
                detail = getattr(exc, "stderr", "") or exc
                warnings.warn(f"pwopsd.exact_kernel: the compiled kernels did not build ({detail}); "
                              f"the Python paths give the same bits, more slowly", RuntimeWarning, stacklevel=3)
                lib = None
        _state["lib"] = lib
    return _state["lib"]


def _load():
    """The compiled rounding, or None."""
    lib = _library()
    return None if lib is None else lib.pwopsd_round


def unary():
    """The compiled elementwise function (``pwopsd_unary``), or None: see
    :mod:`pwopsd.exact_elementwise`."""
    lib = _library()
    return None if lib is None else lib.pwopsd_unary


def available() -> bool:
    return _load() is not None


def _row_major(x: torch.Tensor) -> bool:
    """Each matrix of ``x`` (the last two dimensions) laid out by rows, without gaps."""
    return x.stride(-1) == 1 and x.stride(-2) == x.shape[-1] or x.shape[-2] == 1 and x.stride(-1) == 1


def rounded64(x: torch.Tensor, dim: int, beta: int) -> torch.Tensor | None:
    """:func:`pwopsd.exact_matmul.rounded64` of a float32 CPU matrix or batch of matrices along
    ``dim`` -1 or -2, computed by the compiled kernel; None where it does not apply (another dtype
    or rank, or no kernel), for the caller to take the torch path. A matrix laid out by columns (a
    transposed weight) is rounded as its transpose and returned as a transposed view: a matrix
    product takes either layout, and no copy is made."""
    if x.dtype != torch.float32 or x.device.type != "cpu" or x.dim() not in (2, 3) or dim not in (-1, -2):
        return None
    fn = _load()
    if fn is None:
        return None
    if not _row_major(x) and _row_major(x.transpose(-1, -2)):
        return rounded64(x.transpose(-1, -2), -1 if dim == -2 else -2, beta).transpose(-1, -2)
    if not _row_major(x):
        x = x.contiguous()
    out = torch.empty(x.shape, dtype=torch.float64)
    if out.numel() == 0:
        return out
    rows, cols = x.shape[-2:]
    batch, step = (x.shape[0], x.stride(0)) if x.dim() == 3 else (1, 0)
    if fn(x.data_ptr(), out.data_ptr(), batch, rows, cols, step, beta, int(dim == -1)) != 0:
        raise MemoryError("pwopsd.exact_kernel: out of memory")
    return out
