"""Elementwise functions (``sqrt``, ``exp``, ``log``, ``cos``, ...) whose bits do not depend on the
CPU's vendor: the second half of tiny mode's "the same digits on every CPU" (issue 50), beside
:mod:`pwopsd.exact_matmul`.

Why: torch computes fifteen elementwise functions of float32 and float64 CPU tensors with MKL's
vector math library (``vmsSqrt``, ``vmsExp``, ``vmsLn``, ``vmsCos``, ... in high-accuracy mode),
and MKL picks their code by the CPU: on an AMD EPYC (Zen 4, AVX2) 16% of float32 square roots were
not the correctly rounded value and 5% of cosines differed from it, whatever ``MKL_CBWR`` said,
and a tiny build there (AdamW's square root every step, the rotary embedding's cos and sin) left
the digest written on Intel hosts within 20 steps. ``MKL_VERBOSE`` does not report these
functions, which is how they hid behind a check that saw MKL run DGEMM alone.

How: each such function of a float32 or float64 CPU tensor is computed by the C library's
double-precision function (glibc's, which chooses its code by instruction-set features, the same on
every x86-64 host with AVX2 and FMA, never by vendor), one value at a time, a float32 value widened
exactly and the result rounded once to float32: nearly always the correctly rounded value, and the
same bits on every host with the same C library. The compiled loop of :mod:`pwopsd.exact_kernel`
runs it; without a C compiler the same library functions are called from Python (the same bits,
far more slowly).

It is installed as torch's CPU kernel of each function and of its in-place form (``aten::exp``,
``aten::exp_``) by :func:`pwopsd.exact_matmul.install`, so it is on wherever the exact products
are (config ``cpu_matmul: exact``, tiny mode); autograd's formulas call these kernels too. Other
dtypes (bfloat16, half, complex) and the ``out=`` forms run torch's own kernels: tiny mode computes
in float32, and ``tests/test_exact_matmul.py`` checks under a debugger that a tiny build step,
training step and generation call no MKL vector-math function.

Dropout's masks too: torch draws ``bernoulli_(p)`` (a scalar ``p``: ``F.dropout``, the diagnostic's
MC dropout) from MKL's random streams on an Intel CPU and from its own generator on any other
vendor (an explicit vendor test in ATen), so the same seed gave other masks on Intel than on AMD.
:func:`install` sends it to the form with a tensor of probabilities, which draws from torch's own
generator on every CPU.
"""

from __future__ import annotations

import ctypes
import ctypes.util

import torch

from pwopsd import exact_kernel

# In the order of the compiled kernel's table (pwopsd.exact_kernel.SOURCE): torch's names, which are
# the C library's too. These are the functions torch 2.13 sends to MKL's vector math for float32 and
# float64 on the CPU (found with a debugger on each of torch's elementwise functions; trunc is exact
# in any implementation and is routed only so that no vector-math call remains).
UNARY = ("acos", "asin", "atan", "cos", "erf", "erfc", "exp", "log", "log10", "log2", "sin", "sqrt", "tan",
         "tanh", "trunc")
_DTYPES = (torch.float32, torch.float64)
_INTEGRAL = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
_libm: dict = {}
_library = None


def compute(name: str, x: torch.Tensor) -> torch.Tensor:
    """``name`` (one of :data:`UNARY`) of a float32 or float64 CPU tensor, elementwise, as the C
    library's double function gives it (rounded once to float32 for a float32 input); a new
    contiguous tensor of ``x``'s shape and dtype."""
    op = UNARY.index(name)
    src = x.contiguous()
    out = torch.empty(src.shape, dtype=src.dtype)
    if out.numel() == 0:
        return out
    fn = exact_kernel.unary()
    if fn is not None:
        if fn(op, src.data_ptr(), out.data_ptr(), src.numel(), int(src.dtype == torch.float64)) != 0:
            raise ValueError(f"pwopsd.exact_kernel: no elementwise function {name!r}")
        return out
    f = _libm_function(name)
    values = [f(v) for v in src.to(torch.float64).flatten().tolist()]
    return torch.tensor(values, dtype=torch.float64).to(src.dtype).view(src.shape)


def _libm_function(name: str):
    """The C library's double ``name`` through ctypes: the function the compiled kernel calls."""
    if name not in _libm:
        lib = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = ctypes.c_double, [ctypes.c_double]
        _libm[name] = fn
    return _libm[name]


def _kernels(name: str):
    """torch's CPU kernels of ``aten::<name>`` and ``aten::<name>_``: float32 and float64 inputs
    (integers and bool first promoted to the default dtype, as torch does) by :func:`compute`,
    other dtypes by torch's own ``out=`` kernel, which stays torch's."""
    native = getattr(torch.ops.aten, name).out

    def functional(x):
        if x.device.type == "cpu" and x.dtype in _INTEGRAL:
            x = x.to(torch.get_default_dtype())
        if x.device.type == "cpu" and x.dtype in _DTYPES:
            return compute(name, x)
        return native(x, out=torch.empty_like(x))

    def in_place(x):
        if x.device.type == "cpu" and x.dtype in _DTYPES:
            return x.copy_(compute(name, x))
        return native(x, out=x)

    return functional, in_place


def install() -> None:
    """Route this process's CPU float32 and float64 elementwise functions of :data:`UNARY` through
    :func:`compute` (idempotent)."""
    global _library
    if _library is not None:
        return
    kernels = {"bernoulli_.float": bernoulli_}
    for name in UNARY:
        kernels[name], kernels[f"{name}_"] = _kernels(name)
    _library = override_cpu_kernels(kernels)


def override_cpu_kernels(kernels: dict) -> torch.library.Library:
    """Register each ``{aten op name: function}`` as torch's CPU kernel of that op; the returned
    library holds them until its ``_destroy()``. (Shared with :mod:`pwopsd.exact_matmul`.)"""
    import warnings

    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="(?s).*Overriding a previously registered kernel")
        for name, fn in kernels.items():
            lib.impl(name, fn, "CPU")
    return lib


def bernoulli_(x: torch.Tensor, p: float = 0.5, *, generator=None) -> torch.Tensor:
    """``x.bernoulli_(p)`` for a scalar ``p`` on the CPU, drawn as with a tensor of probabilities
    (``aten::bernoulli_.Tensor``): from torch's own generator on every CPU vendor, where torch's
    scalar form draws from MKL's streams on Intel CPUs alone."""
    if not 0 <= p <= 1:
        raise ValueError(f"bernoulli_ expects p to be in [0, 1], but got p={p}")
    return x.bernoulli_(torch.full(x.shape, p, dtype=torch.float64), generator=generator)


def uninstall() -> None:
    """Give the functions back to torch (tests)."""
    global _library
    if _library is not None:
        _library._destroy()
        _library = None
