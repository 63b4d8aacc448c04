"""Matrix products whose bits do not depend on the CPU, its vendor, the BLAS library or the order
in which it sums: tiny mode's answer to "the same digits on Intel as on AMD" (issue 50).

Why: torch sends every fp32 matrix product on the CPU to MKL's ``sgemm``, and MKL picks its code by
the CPU's vendor and model. ``MKL_CBWR=AVX2,STRICT`` (conditional numerical reproducibility) made
AMD hosts agree with each other, but an Intel Xeon (Emerald Rapids) with the same setting rounded
otherwise, and a 350-step build amplified that into another model. No MKL setting reproduces AMD's
bits there (``../shared/spec/intel_reference.md``). So tiny mode does not ask a vendor library to
be reproducible; it computes products whose result cannot depend on how they are summed.

How (the first step of the Ozaki scheme): each row of the left factor is rounded to ``beta`` bits
below its largest magnitude (an integer of at most ``beta`` bits times a power of two), each column
of the right factor too, with ``2 * beta + ceil(log2(K)) <= 53``. Then every term of a dot product
is an integer multiple of one power of two, and every partial sum is such a multiple below
``2**53`` of them: exact in float64, whatever the order, blocking, threads or instruction set of the
``dgemm`` that computes it. The one rounding to float32 at the end is IEEE round-to-nearest-even.
So the result is a function of the inputs alone: ``fp32(round_rows(A) @ round_cols(B))``, the
product computed exactly.

The price: entries far below their row's (column's) largest lose bits (``beta`` is 20 to 26 bits
relative to the row's maximum, against float32's 24 relative to each entry), so this is not
torch's fp32 product, and a dgemm costs about twice an sgemm. Measured in
``benchmarks/exact_matmul.py``; chosen for tiny mode only (config ``cpu_matmul: exact``), never for
the paper's GPU runs.

It is installed as torch's CPU kernel of ``aten::mm``, ``addmm``, ``bmm`` and ``baddbmm`` (every
matrix product of a float32 linear layer, attention and their backward passes goes through these
four), for float32 inputs; other dtypes run torch's own kernel. The fused CPU attention kernel calls
MKL directly, so :func:`install` also turns it off, and attention runs torch's reference math.
That math's softmax backward kernel gives other bits on two threads than on one (a few scattered
rows), so results hold for the configured thread count (tiny mode's build: 2), not across thread
counts (docs/decisions.md).
MKL also computes torch's float32 ``sqrt``, ``exp``, ``log``, ``cos`` and others (its vector math),
by the CPU's vendor too: :func:`install` routes those through :mod:`pwopsd.exact_elementwise`.
``tests/test_exact_matmul.py`` checks with ``MKL_VERBOSE`` and ``ONEDNN_VERBOSE``, and under a
debugger for the vector math that ``MKL_VERBOSE`` does not report, that a tiny build step,
training step and generation call no vendor routine but ``DGEMM``.
"""

from __future__ import annotations

import contextlib
import math
import os

import torch

from pwopsd import exact_elementwise, exact_kernel

ENV = "PWOPSD_CPU_MATMUL"  # "exact": the jobs of a run install the exact products (set by the pin)
MANTISSA_BITS = 53  # float64
_OPS = ("mm", "addmm", "bmm", "baddbmm")
_library = None
# While reuse_weights() is active: each parameter's rounding as a right factor, computed once.
_weights: dict | None = None


def integer_bits(k: int) -> int:
    """Bits each factor keeps (``beta``) for a ``k``-term dot product to be exact in float64:
    ``k * 2**beta * 2**beta <= 2**53``."""
    return (MANTISSA_BITS - max(0, math.ceil(math.log2(max(1, k))))) // 2


def pow2(n: torch.Tensor) -> torch.Tensor:
    """``2.0 ** n`` in float64, exactly, built from its bits (``n`` integer, within float64's
    normal exponents): a power of two from ``pow`` or ``exp2`` would depend on their vector code."""
    return ((n.to(torch.int64) + 1023) << 52).view(torch.float64)


def rounded64(x: torch.Tensor, dim: int, beta: int) -> torch.Tensor:
    """``x`` in float64 rounded, along ``dim``, to multiples of ``2**(e - beta)``, ``e`` the exponent
    of the largest magnitude there (``max|x| < 2**e``): ``q * 2**(e - beta)`` with ``q`` an integer,
    ``|q| <= 2**beta``. Scaling by powers of two is exact, so the rounding (half to even) is the one
    inexact step."""
    largest = x.amax(dim=dim, keepdim=True).maximum(x.amin(dim=dim, keepdim=True).neg_())  # the fastest max|x|
    _, e = torch.frexp(largest)
    scale = pow2(beta - e)
    # the reciprocal of a power of two is exact, and costs one operation against pow2's five
    return x.to(torch.float64).mul_(scale).round_().mul_(scale.reciprocal_())


def exact_product64(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``rounded(a) @ rounded(b)`` in float64, exactly (see the module's docstring); ``a`` is
    ``(..., M, K)``, ``b`` ``(..., K, N)`` with the same batch shape.

    The rounded factors carry their powers of two, so every term of the dot product of row ``i``
    and column ``j`` is an integer multiple of ``2**(e_i + e_j - 2 * beta)`` and the sum of their
    magnitudes is at most ``2**53`` such units: every partial sum is exact, in any order, and the
    product needs no scaling afterwards."""
    beta = integer_bits(a.shape[-1])
    ra, rb = _rounded(a, -1, beta), _rounded_right(b, beta)
    out = torch.empty(ra.shape[:-1] + rb.shape[-1:], dtype=torch.float64)
    if a.dim() == 2:
        return torch.ops.aten.mm.out(ra, rb, out=out)
    return torch.ops.aten.bmm.out(ra, rb, out=out)


@contextlib.contextmanager
def reuse_weights():
    """Within this context, the rounding of a right factor that is a model's parameter (or a view
    of one, as ``linear`` passes its weight transposed) is computed once and reused by the products
    that follow: a decode loop rounds each weight once instead of once a token. The rounding is a
    function of the parameter's values alone, so the products are the same bits; a parameter
    changed in place (its version counter moves) is rounded again. Parameters must not be written
    through ``.data`` inside the context (that moves no version counter): a generation loop, which
    changes none, is what it is for. Nested uses share the outer cache; it is dropped on exit."""
    global _weights
    outer = _weights
    if outer is None:
        _weights = {}
    try:
        yield
    finally:
        if outer is None:
            _weights = None


def _rounded(x: torch.Tensor, dim: int, beta: int) -> torch.Tensor:
    """:func:`rounded64`, by the compiled kernel where it applies (:mod:`pwopsd.exact_kernel`: the
    same bits, in one pass)."""
    fast = exact_kernel.rounded64(x, dim, beta)
    return fast if fast is not None else rounded64(x, dim, beta)


def _rounded_right(b: torch.Tensor, beta: int) -> torch.Tensor:
    """``rounded64(b, -2, beta)``, from the cache of :func:`reuse_weights` when ``b`` is a parameter."""
    cache = _weights
    if cache is not None:
        base = b._base if b._base is not None else b
        if isinstance(base, torch.nn.Parameter):
            key = (id(base), base._version, b.shape, b.stride(), b.storage_offset(), beta)
            hit = cache.get(key)
            if hit is None:
                # the entry holds the parameter: its id and memory cannot be another's while cached
                hit = cache[key] = (base, _rounded(b, -2, beta))
            return hit[1]
    return _rounded(b, -2, beta)


def _routed(*tensors) -> bool:
    return all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors)


def _kernel(name: str):
    """torch's CPU kernel of ``aten::<name>`` (``mm``, ``bmm``, ``addmm``, ``baddbmm``) in the exact
    form for float32 inputs; other dtypes go to torch's own kernel (its ``.out`` overload, which the
    override leaves alone). ``addmm`` and ``baddbmm`` follow torch's semantics: ``beta * input +
    alpha * product``, rounded once to float32, the input ignored (NaN included) where ``beta == 0``."""
    native = getattr(torch.ops.aten, name).out

    def product(a, b):
        if not _routed(a, b):
            return native(a, b, out=a.new_empty(a.shape[:-1] + b.shape[-1:], dtype=torch.result_type(a, b)))
        return exact_product64(a, b).to(torch.float32)

    def scaled(inp, a, b, *, beta=1, alpha=1):
        if not _routed(inp, a, b):
            out = a.new_empty(a.shape[:-1] + b.shape[-1:], dtype=torch.result_type(a, b))
            return native(inp, a, b, beta=beta, alpha=alpha, out=out)
        out = exact_product64(a, b)
        if alpha != 1:
            out = out * alpha
        if beta != 0:
            out = out + (inp.to(torch.float64) if beta == 1 else inp.to(torch.float64) * beta)
        return out.to(torch.float32)

    return scaled if name.startswith(("addmm", "baddbmm")) else product


def installed() -> bool:
    return _library is not None


def install() -> None:
    """Make this process's CPU float32 matrix products exact (idempotent). Also turns off torch's
    fused CPU attention kernels, which call MKL directly: attention then runs its reference math
    (matrix products and a softmax), through the kernels above; and routes the elementwise
    functions torch would send to MKL's vector math (:mod:`pwopsd.exact_elementwise`)."""
    global _library
    if _library is not None:
        return
    lib = exact_elementwise.override_cpu_kernels({name: _kernel(name) for name in _OPS})
    torch.backends.cuda.enable_flash_sdp(False)  # the flag also governs the CPU flash kernel
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    exact_elementwise.install()  # the elementwise functions MKL would compute (its vector math)
    _library = lib


def uninstall() -> None:
    """Give the four products back to torch (tests)."""
    global _library
    if _library is not None:
        _library._destroy()
        _library = None
        torch.backends.cuda.enable_flash_sdp(True)
        torch.backends.cuda.enable_mem_efficient_sdp(True)
        exact_elementwise.uninstall()


def install_if_configured(environ=os.environ) -> bool:
    """Install the exact products when the run asks for them (``PWOPSD_CPU_MATMUL=exact``, set by
    :func:`pwopsd.runtime.pin_kernel_path` from config ``cpu_matmul``); every job that computes with
    torch calls this through :func:`pwopsd.runtime.set_threads`."""
    value = environ.get(ENV, "")
    if value == "exact":
        install()
        return True
    if value not in ("", "native"):
        raise ValueError(f"{ENV}={value!r}: expected exact or native (config cpu_matmul)")
    return False
