"""Tiny mode's exact CPU matrix products (pwopsd.exact_matmul, config ``cpu_matmul: exact``):
the result is a function of the inputs alone (checked against exact integer arithmetic, under
permuted sums, other thread counts and other batch compositions), it stays close to the float64
product, and in a tiny build, training and generation step no vendor routine but the exact DGEMM
runs (``MKL_VERBOSE``, ``ONEDNN_VERBOSE``) and no function of MKL's vector math (under gdb): the
check that the design holds, which a native run fails. The elementwise functions MKL would compute
(pwopsd.exact_elementwise) equal the C library's, by the compiled loop and by the Python path."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from fractions import Fraction

import pytest
import torch

from conftest import REPO, unavailable
from pwopsd import exact_elementwise as E
from pwopsd import exact_kernel as K
from pwopsd import exact_matmul as X


@pytest.fixture(params=["c", "torch"])
def exact(request, monkeypatch):
    """The exact products installed, their rounding by the compiled kernel or by torch's path."""
    monkeypatch.setenv(K.ENV, request.param)
    monkeypatch.setattr(K, "_state", {})
    X.install()
    yield request.param
    X.uninstall()


def test_integer_bits_keep_every_dot_product_below_2_to_the_53():
    for k in (1, 2, 3, 31, 32, 33, 128, 384, 3000, 65536, 10**6):
        beta = X.integer_bits(k)
        assert k * 2 ** (2 * beta) <= 2 ** 53 and 2 ** math.ceil(math.log2(k)) * 2 ** (2 * beta + 2) > 2 ** 53


def test_pow2_is_exact():
    n = torch.arange(-1022, 1024)
    assert [float(v) for v in X.pow2(n)] == [math.ldexp(1.0, int(i)) for i in n]


def _reference(a: torch.Tensor, b: torch.Tensor) -> list[list[float]]:
    """The same product by Python's exact arithmetic: each row (column) rounded to beta bits below
    its largest magnitude's exponent (math.frexp, round half to even), the dot products summed as
    fractions, then rounded once to float32 (through float64, which holds it exactly)."""
    k = a.shape[1]
    beta = X.integer_bits(k)

    def rounded(vec):
        e = math.frexp(max(abs(float(v)) for v in vec))[1]
        return [Fraction(round(Fraction(float(v)) * Fraction(2) ** (beta - e))) * Fraction(2) ** (e - beta) for v in vec]

    rows = [rounded(a[i]) for i in range(a.shape[0])]
    cols = [rounded(b[:, j]) for j in range(b.shape[1])]
    return [[float(torch.tensor(float(sum(x * y for x, y in zip(r, c))), dtype=torch.float64).to(torch.float32))
             for c in cols] for r in rows]


def test_the_product_equals_exact_integer_arithmetic(exact):
    g = torch.Generator().manual_seed(3)
    a = torch.randn(5, 37, generator=g) * torch.logspace(-3, 3, 5).unsqueeze(1)  # rows of other scales
    b = torch.randn(37, 4, generator=g)
    b[:, 2] = 0.0  # a zero column
    assert (a @ b).tolist() == _reference(a, b)


def test_the_bits_do_not_depend_on_summation_order_threads_or_batch(exact):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(300, 128, generator=g), torch.randn(128, 77, generator=g)
    c = a @ b
    perm = torch.randperm(128, generator=g)
    assert torch.equal(c, a[:, perm] @ b[perm])  # another order of the K-term sums
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(c, a @ b)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(c[:7], a[:7] @ b)  # a row's result does not depend on the other rows
    assert torch.equal(torch.bmm(a.view(3, 100, 128), b.expand(3, 128, 77)).reshape(300, 77), c)
    native = a.double() @ b.double()
    assert ((c.double() - native).abs() <= 2.0 ** -16 * a.abs().amax(1, keepdim=True) * b.abs().amax(0, keepdim=True)).all()


def test_addmm_baddbmm_linear_and_autograd_run_through_it(exact):
    g = torch.Generator().manual_seed(1)
    bias, a, b = torch.randn(6, 5, generator=g), torch.randn(6, 9, generator=g), torch.randn(9, 5, generator=g)
    prod = X.exact_product64(a, b)
    assert torch.equal(torch.addmm(bias, a, b, beta=0.5, alpha=2.0), (2.0 * prod + 0.5 * bias.double()).float())
    assert torch.equal(torch.addmm(bias * float("nan"), a, b, beta=0), prod.float())  # beta = 0 ignores the input
    assert torch.equal(torch.baddbmm(bias[None], a[None], b[None])[0], (prod + bias.double()).float())
    lin = torch.nn.Linear(9, 5)
    x = torch.randn(2, 6, 9, generator=g, requires_grad=True)
    lin(x).square().sum().backward()
    assert x.grad.shape == x.shape and lin.weight.grad.shape == lin.weight.shape
    # other dtypes keep torch's own kernels
    a64, b64 = a.double(), b.double()
    X.uninstall()
    native64, native16 = a64 @ b64, a.bfloat16() @ b.bfloat16()
    X.install()
    assert torch.equal(a64 @ b64, native64) and torch.equal(a.bfloat16() @ b.bfloat16(), native16)


def test_reused_weight_roundings_give_the_same_bits_and_follow_an_in_place_change(exact, monkeypatch):
    """reuse_weights: a parameter's rounding (here a Linear weight, which linear passes transposed)
    is computed once for the products that follow, with the same results as without the cache; an
    in-place change of the parameter is rounded again; activations are never cached; the cache goes
    with the context."""
    calls = []
    rounded = X._rounded
    monkeypatch.setattr(X, "_rounded", lambda x, dim, beta: calls.append(dim) or rounded(x, dim, beta))
    g = torch.Generator().manual_seed(2)
    lin = torch.nn.Linear(16, 8)
    x, y = torch.randn(5, 16, generator=g), torch.randn(3, 7, 16, generator=g)
    with torch.inference_mode():
        plain = [lin(x), lin(y)]
        calls.clear()
        with X.reuse_weights():
            cached = [lin(x), lin(y)]
            assert calls == [-1, -2, -1]  # the second product rounds its input only
            with torch.no_grad():
                lin.weight.mul_(0.5)
            changed = lin(x)
            assert calls == [-1, -2, -1, -1, -2]  # the changed weight is rounded again
        assert X._weights is None
        assert all(torch.equal(a, b) for a, b in zip(plain, cached))
        assert torch.equal(changed, lin(x))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int64)


def test_the_compiled_rounding_gives_torchs_bits_in_every_layout_and_at_special_values(monkeypatch):
    """pwopsd.exact_kernel is a matter of speed only: its rounding equals rounded64's bit for bit
    (NaN, infinities, signed zeros, subnormals, float32's extremes, ties), for left and right
    factors, batches, transposed and strided views; a machine with a C compiler builds it."""
    monkeypatch.setenv(K.ENV, "c")
    monkeypatch.setattr(K, "_state", {})
    if K._compiler() is None:
        unavailable("no C compiler: tiny mode takes torch's rounding (the same bits), nothing to compare")
    assert K.available(), "the compiled rounding did not build (is a C compiler on the PATH as cc or $CC?)"
    g = torch.Generator().manual_seed(5)
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-45, -1e-40, 3.4e38, -3.4e38,
                            0.5, 1.5, 2.5, -2.5, 2.0 ** -20 * 3, 1.0 + 2.0 ** -23])
    checked = 0
    for shape in [(1, 1), (1, 9), (9, 1), (32, 128), (128, 384), (3, 5, 7), (2, 1, 33), (4, 16, 1)]:
        x = torch.randn(shape, generator=g) * torch.logspace(-38, 38, shape[-1]).clamp(max=1e30)
        flat = x.view(-1)
        picks = torch.randint(0, flat.numel(), (min(flat.numel() // 3, len(special)),), generator=g)
        flat[picks] = special[: len(picks)]
        views = [x, x.transpose(-1, -2), x[..., ::2], x.transpose(-1, -2)[..., ::2]]
        for view in views:
            for dim in (-1, -2):
                for beta in (12, 20, 26):
                    fast = K.rounded64(view, dim, beta)
                    assert fast is not None and fast.shape == view.shape
                    assert torch.equal(_bits(fast), _bits(X.rounded64(view, dim, beta))), (shape, view.stride(), dim, beta)
                    checked += 1
    assert checked == 8 * 4 * 2 * 3
    assert K.rounded64(torch.randn(3, 3, dtype=torch.float64), -1, 20) is None  # other dtypes: torch's path


def test_the_compiled_rounding_can_be_turned_off_and_a_bad_setting_is_named(monkeypatch, tmp_path):
    monkeypatch.setattr(K, "_state", {})
    monkeypatch.setenv(K.ENV, "torch")
    assert not K.available() and K.rounded64(torch.ones(2, 2), -1, 20) is None
    monkeypatch.setenv(K.ENV, "fast")
    with pytest.raises(ValueError, match=K.ENV):
        K.available()
    # a compiler that fails: a warning, and the torch path (same bits)
    monkeypatch.setenv(K.ENV, "c")
    monkeypatch.setenv(K.DIR_ENV, str(tmp_path))
    monkeypatch.setenv("CC", "false")
    with pytest.warns(RuntimeWarning, match="did not build"):
        assert not K.available()


def test_uninstall_gives_torch_its_products_back():
    a, b = torch.randn(40, 64), torch.randn(64, 30)
    native = a @ b
    X.install()
    exact_result = a @ b
    X.uninstall()
    assert torch.equal(a @ b, native) and not torch.equal(exact_result, native)


def test_a_bad_setting_names_the_config_key():
    with pytest.raises(ValueError, match="cpu_matmul"):
        X.install_if_configured({X.ENV: "fast"})
    assert X.install_if_configured({}) is False and not X.installed()


# A tiny build step, a LoRA training step, a merge and a generation, in a fresh process, once for each
# mode named on the command line (``exact``, ``native``): each mode's vendor calls follow its line
# "== MODE" (C's buffered output, where MKL and oneDNN print, is flushed before it), and under gdb its
# call of glibc's ``memfrob``, which nothing else calls: gdb prints that breakpoint's frame in its own
# output, in order with the vendor routines' frames, whatever the buffering of the two streams.
STEP = r"""
import ctypes, os, sys, types, torch
from peft import LoraConfig, get_peft_model
from pwopsd import exact_matmul as X
from pwopsd.config import load_config
from pwopsd import settings
from pwopsd.runtime import set_threads
from pwopsd.tiny import examples as E
from pwopsd.tiny import model as M
cfg = E.TinyBuildConfig.from_dict(settings.tiny_model(load_config("tiny/config/config.yaml"), types.SimpleNamespace(model="tiny_qwen3")))
object.__setattr__(cfg, "max_steps", 2)
M.is_check_step = lambda done, cfg: False
libc = ctypes.CDLL(None)
for mode in sys.argv[1:]:
    libc.fflush(None)
    os.write(1, f"== {mode}\n".encode())
    libc.memfrob(ctypes.create_string_buffer(1), 0)
    X.uninstall()
    os.environ[X.ENV] = mode
    set_threads(2)
    tok = E.tiny_tokenizer(cfg, corpus_size=200)
    model = M.build_model(cfg, tok)
    M.pretrain(model, tok, cfg, log_every=10**9)
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    ids = tok(["1 + 2 =", "3 + 4 ="], return_tensors="pt", padding=True)
    peft(**ids, labels=ids["input_ids"]).loss.backward()
    merged = peft.merge_and_unload()
    merged.generate(**ids, do_sample=True, max_new_tokens=4, pad_token_id=tok.pad_token_id)
libc.fflush(None)
print("ok")
"""


# gdb stops at torch's library load, then breaks on every entry point of MKL's vector math (vms*/vmd*:
# sqrt, exp, ln, cos, ...) and random streams (viRngBernoulli, ...), which MKL_VERBOSE does not report,
# and on the modes' marker (memfrob), and prints each hit's frame (nothing that would call into the
# program: another thread may stop meanwhile).
GDB = """set pagination off
set confirm off
catch load libtorch_cpu
run
rbreak ^vm[sd][A-Z][A-Za-z0-9]*$
rbreak ^v[sdi]Rng[A-Z][A-Za-z]*$
break memfrob
commands 2-$bpnum
silent
bt 1
continue
end
delete 1
continue
"""


def _vendor_calls(*modes: str, debugger: bool = False) -> dict[str, list[str]]:
    """The vendor routines a tiny step calls in each mode (one process, the modes in turn): MKL's
    (``MKL_VERBOSE``) and oneDNN's (``ONEDNN_VERBOSE``), or with ``debugger`` the functions of MKL's
    vector math, which neither reports (under gdb)."""
    env = {**os.environ, "MKL_VERBOSE": "1", "ONEDNN_VERBOSE": "1", "PYTHONPATH": str(REPO / "src")}
    command = [sys.executable, "-c", STEP, *modes]
    if debugger:
        gdb = shutil.which("gdb")
        if gdb is None:  # every CI host kind has gdb (the machine's tools): there a skip would hide the check
            unavailable("gdb is not installed: MKL's vector math is not watched")
        script = REPO / ".pytest_cache" / "vector_math.gdb"
        script.parent.mkdir(exist_ok=True)
        script.write_text(GDB)
        command = [gdb, "-batch", "-x", str(script), "--args", *command]
        env.pop("MKL_VERBOSE"), env.pop("ONEDNN_VERBOSE")
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and "ok" in proc.stdout, (proc.stdout + proc.stderr)[-3000:]
    assert [line[3:] for line in proc.stdout.splitlines() if line.startswith("== ")] == list(modes), proc.stdout[-3000:]
    stray = [line for line in proc.stderr.splitlines() if line.startswith(("MKL_VERBOSE", "onednn_verbose", "#0"))]
    assert not stray, stray[:5]  # each call is read from stdout, after its mode's line
    calls, mode, marked = {}, None, iter(modes)
    for line in proc.stdout.splitlines():
        if debugger and line.startswith("#0") and " memfrob " in line:  # gdb's own mark of the next mode
            mode = next(marked)
            calls[mode] = set()
        elif not debugger and line.startswith("== "):
            mode = line[3:]
            calls[mode] = set()
        elif mode is None:
            continue
        elif debugger and line.startswith("#0") and " in v" in line:  # "#0  0x... in vmsSqrt () from .../libtorch_cpu.so"
            calls[mode].add(f"MKL {line.split(' in ')[1].split()[0]}")
        elif not debugger and line.startswith("MKL_VERBOSE") and "oneMKL" not in line:
            calls[mode].add(line.split("(")[0])
        elif not debugger and line.startswith("onednn_verbose") and ",exec," in line:
            calls[mode].add(f"oneDNN {line.split(',')[1]}")
    assert list(calls) == list(modes), (list(calls), proc.stdout[-3000:])  # every mode marked, in order
    return {m: sorted(c) for m, c in calls.items()}


@pytest.mark.long
def test_no_vendor_routine_but_the_exact_dgemm_computes_a_tiny_step():
    """With ``cpu_matmul: exact`` MKL runs DGEMM (and its batched form) on integers only (exact in any order) and oneDNN
    nothing; natively the same step calls MKL's SGEMM (whose bits follow the CPU's vendor)."""
    calls = _vendor_calls("exact", "native")
    assert "MKL_VERBOSE DGEMM" in calls["exact"] and set(calls["exact"]) <= {"MKL_VERBOSE DGEMM", "MKL_VERBOSE DGEMM_BATCH"}, calls
    assert "MKL_VERBOSE SGEMM" in calls["native"]


@pytest.mark.heavy
def test_no_function_of_mkls_vector_math_runs_in_a_tiny_step():
    """MKL computes torch's float32 sqrt, exp, log, cos, ... by the CPU's vendor, and ``MKL_VERBOSE``
    does not say so: under gdb, the exact mode's build, training and generation step calls none of
    them (pwopsd.exact_elementwise), where torch's own kernels call AdamW's ``vmsSqrt`` and the rotary
    embedding's ``vmsCos`` and ``vmsSin`` (both modes under one gdb: its start and symbol search are
    most of the test's 29 CPU-seconds on a 2-core Zen 3 host, the steps about 2)."""
    calls = _vendor_calls("exact", "native", debugger=True)
    assert calls["exact"] == [], calls
    assert {"MKL vmsSqrt", "MKL vmsCos", "MKL vmsSin"} <= set(calls["native"]), calls


SPECIAL = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-45, -1e-40, 3.4e38, -3.4e38, 0.5, -0.5, 1.0,
           -1.0, 2.0, 1e-8, 88.5, -104.0, 710.0, 1e30]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kernel", ["c", "torch"])
def test_elementwise_functions_are_the_c_librarys_rounded_once(kernel, dtype, monkeypatch):
    """Each function MKL's vector math would compute gives, installed, the C library's double value
    (Python's ``math`` calls the same functions; its domain errors are NaN or infinities here, as in
    C) rounded once to the input's dtype, in the functional and in-place forms, at special values too;
    the compiled loop and the Python path give the same bits."""
    monkeypatch.setenv(K.ENV, kernel)
    monkeypatch.setattr(K, "_state", {})
    g = torch.Generator().manual_seed(3)
    x = torch.cat([torch.randn(2000, generator=g, dtype=torch.float64) * 4,
                   torch.tensor(SPECIAL, dtype=torch.float64)]).to(dtype)

    def libm(name, v):
        f = getattr(math, name)
        try:
            r = float(f(v))
        except ValueError:  # a domain error, C's NaN or infinity
            r = -math.inf if v == 0 and name.startswith("log") else math.nan
        except OverflowError:  # exp's overflow, trunc of an infinity
            r = math.copysign(math.inf, v) if name == "trunc" else math.inf
        if name == "trunc" and r == 0:
            r = math.copysign(0.0, v)
        return r

    X.install()
    try:
        for name in E.UNARY:
            got = getattr(torch, name)(x)
            inplace = x.clone()
            getattr(inplace, f"{name}_")()
            want = torch.tensor([libm(name, v) for v in x.to(torch.float64).tolist()], dtype=torch.float64).to(dtype)
            same = (got == want) | (got.isnan() & want.isnan())
            signs = got.signbit() == want.signbit()
            assert same.all() and (signs | want.isnan()).all(), (name, x[~(same & (signs | want.isnan()))][:5])
            assert torch.equal(got.view(torch.uint8), inplace.view(torch.uint8)), name
            assert got.dtype == dtype
    finally:
        X.uninstall()


def test_elementwise_functions_keep_torchs_dtypes_and_autograd():
    """Integers are promoted as torch promotes them, bfloat16 runs torch's own kernel, and a gradient
    through the routed functions is torch's formula of the routed values."""
    X.install()
    try:
        assert torch.sqrt(torch.tensor([4, 9])).dtype == torch.get_default_dtype()
        assert torch.equal(torch.sqrt(torch.tensor([4, 9])), torch.tensor([2.0, 3.0]))
        assert torch.exp(torch.ones(3, dtype=torch.bfloat16)).dtype == torch.bfloat16
        x = torch.linspace(0.1, 3.0, 50, requires_grad=True)
        (torch.cos(x).sum() + torch.sqrt(x).sum()).backward()
        with torch.no_grad():
            want = -torch.sin(x) + 0.5 / torch.sqrt(x)
        torch.testing.assert_close(x.grad, want, rtol=1e-6, atol=1e-7)
    finally:
        X.uninstall()


def test_dropout_masks_come_from_torchs_own_generator_on_every_vendor():
    """torch draws ``bernoulli_(p)`` with a scalar ``p`` (``F.dropout``, the diagnostic's MC dropout)
    from MKL's streams on Intel CPUs only; installed, it draws as the tensor-of-probabilities form,
    from torch's generator: the same masks on Intel and AMD. (On an Intel host torch's own scalar
    form gives other masks, so there this fails without the override.)"""
    X.install()
    try:
        torch.manual_seed(7)
        masks = torch.nn.functional.dropout(torch.ones(4096), 0.25, training=True)
        torch.manual_seed(7)
        want = torch.empty(4096).bernoulli_(torch.full((4096,), 0.75, dtype=torch.float64)) / 0.75
        assert torch.equal(masks, want)
        assert 0.7 < (masks > 0).float().mean() < 0.8
        with pytest.raises(ValueError, match="p to be in"):
            torch.empty(3).bernoulli_(1.5)
    finally:
        X.uninstall()
