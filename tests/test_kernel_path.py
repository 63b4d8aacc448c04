"""Pinning torch's CPU kernel path for a run (config ``cpu_kernel_path``, pwopsd.runtime.pin_kernel_path)."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import unavailable
from pwopsd.runtime import KERNEL_PATHS, MATMUL_ENV, compile_cache_dir, cpu_flags, pin_kernel_path, provenance

ZEN3 = {"sse2", "avx", "avx2", "fma", "sha_ni"}
ZEN5 = ZEN3 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"}
AVX2_ENV = dict(KERNEL_PATHS["avx2"]["env"])
PIN_NAMES = {name for path in KERNEL_PATHS.values() for name in path["env"]}


def test_a_host_that_can_take_the_path_gets_it_in_the_jobs_environment():
    """ATen's path and MKL's and oneDNN's instruction sets, so that an AVX512 host's matrix products
    round as an AVX2 host's do."""
    env = {}
    assert pin_kernel_path("avx2", env, ZEN5) == ("avx2", None)
    assert env == AVX2_ENV
    env = {}
    assert pin_kernel_path("default", env, set()) == ("default", None)  # runs anywhere
    assert env["ATEN_CPU_CAPABILITY"] == "default" and env["MKL_CBWR"] == "COMPATIBLE"
    env = {"ATEN_CPU_CAPABILITY": "", "MKL_CBWR": ""}  # empty is unset (a test clears a path that way)
    assert pin_kernel_path("avx2", env, ZEN3) == ("avx2", None) and env == AVX2_ENV
    env = {"MKL_CBWR": "AUTO"}  # a user's own MKL setting is kept
    pin_kernel_path("avx2", env, ZEN3)
    assert env["MKL_CBWR"] == "AUTO" and env["ATEN_CPU_CAPABILITY"] == "avx2"


def test_a_host_without_the_path_runs_on_its_own_and_says_its_numbers_differ():
    env = {}
    path, note = pin_kernel_path("avx512", env, ZEN3)
    assert path is None and env == {}
    assert "avx512f" in note and "avx512bw" in note and "fma" not in note and "will differ" in note
    path, note = pin_kernel_path("avx2", env, set())  # e.g. an ARM host: no x86 flags at all
    assert path is None and "avx2, fma" in note


def test_a_path_in_the_environment_is_kept_checked_and_said():
    """A Slurm job inherits the submitting host's pin: its node checks it again. A user's or a
    test's forced path wins over the config, with a warning."""
    env = dict(AVX2_ENV)
    assert pin_kernel_path("avx2", env, ZEN5) == ("avx2", None) and env == AVX2_ENV
    env = {"ATEN_CPU_CAPABILITY": "default"}
    path, note = pin_kernel_path("avx2", env, ZEN5)
    # the forced path is pinned completely (issue 51: MKL and oneDNN were left to the CPU, while
    # provenance and the training key said the path was pinned)
    assert path == "default" and env == KERNEL_PATHS["default"]["env"] and "overrides cpu_kernel_path=avx2" in note
    env = {"ATEN_CPU_CAPABILITY": "avx2"}
    assert pin_kernel_path("host", env, ZEN5) == ("avx2", None) and env == AVX2_ENV
    env = dict(AVX2_ENV)  # inherited by a node without AVX2: removed, torch picks its own
    path, note = pin_kernel_path("avx2", env, {"sse2"})
    assert path is None and env == {} and "lacks avx2, fma" in note
    env = {"ATEN_CPU_CAPABILITY": "AVX2"}  # torch ignores upper case
    path, note = pin_kernel_path("avx2", env, ZEN5)
    assert path is None and env == {} and "not a kernel path torch knows" in note
    env = {}
    assert pin_kernel_path("host", env, ZEN5) == (None, None) and env == {}
    assert pin_kernel_path("host", {"ATEN_CPU_CAPABILITY": "avx2"}, ZEN5) == ("avx2", None)
    with pytest.raises(ValueError, match="cpu_kernel_path must be one of"):
        pin_kernel_path("sse4", {}, ZEN5)


def test_with_exact_products_mkl_and_onednn_are_left_alone_and_numpy_is_pinned():
    """cpu_matmul: exact (tiny mode): MKL and oneDNN compute nothing that reaches a result, so their
    instruction sets are left to them (the fastest code); NumPy's BLAS and vector loops still
    choose by CPU model, so they are pinned to the path."""
    from pwopsd.runtime import pin_matmul

    env = {}
    pin_matmul("exact", env)
    assert pin_kernel_path("avx2", env, ZEN5) == ("avx2", None)
    assert env == {MATMUL_ENV: "exact", "ATEN_CPU_CAPABILITY": "avx2", "OPENBLAS_CORETYPE": "Haswell",
                   "NPY_DISABLE_CPU_FEATURES": KERNEL_PATHS["avx2"]["env"]["NPY_DISABLE_CPU_FEATURES"]}
    with pytest.raises(ValueError, match="cpu_matmul must be one of"):
        pin_matmul("fast", {})


def test_cpu_flags_reads_the_first_flags_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 fma\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert cpu_flags(str(info)) == {"fpu", "avx2", "fma"}
    assert cpu_flags(str(tmp_path / "missing")) == set()


def test_numpy_takes_the_pinned_blas_kernels_and_vector_loops():
    """The pin takes effect (a setting a library ignored would fail here): in a job's process
    OpenBLAS runs its Haswell kernels and NumPy dispatches no AVX512 loop, also on an AVX512 host,
    where both would otherwise take their AVX512 code. NumPy dispatches a loop to the best of its
    dispatch targets (``__cpu_dispatch__``: X86_V3, X86_V4, AVX512_ICL, ... in numpy 2.4) that the
    CPU and ``NPY_DISABLE_CPU_FEATURES`` allow; single features such as AVX512F stay reported as
    present when disabled (on an AVX-512 AMD Zen 4), but no AVX-512 target is taken."""
    if "avx2" not in cpu_flags():
        unavailable("needs an x86-64 host with AVX2")
    code = ("import ctypes, glob, json, os, numpy as np; "
            "from numpy._core._multiarray_umath import __cpu_features__ as f, __cpu_dispatch__ as d; "
            "lib = ctypes.CDLL(glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, 'numpy.libs', "
            "'libscipy_openblas*.so'))[0]); "
            "fn = getattr(lib, 'scipy_openblas_get_corename64_', None) or lib.openblas_get_corename; "
            "fn.restype = ctypes.c_char_p; "
            "print(json.dumps({'core': fn().decode(), 'avx512_targets': [t for t in d if f.get(t) "
            "and t.startswith(('AVX512', 'X86_V4'))]}))")

    def run(pinned: bool) -> dict:
        env = {k: v for k, v in os.environ.items() if k not in PIN_NAMES}
        if pinned:
            env[MATMUL_ENV] = "exact"
            pin_kernel_path("avx2", env)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout)

    assert run(pinned=True) == {"core": "Haswell", "avx512_targets": []}
    if "avx512f" in cpu_flags():  # the pin had AVX-512 code to hold back here
        assert run(pinned=False)["avx512_targets"], "an AVX-512 host whose NumPy takes no AVX-512 target unpinned"


def test_torch_takes_the_pinned_path_and_provenance_records_it():
    """The variables set before torch starts decide its path (the jobs inherit them), and every
    result's provenance names the pinned path, also in a process that never imported torch."""
    code = ("import os, sys; from pwopsd.runtime import pin_kernel_path, provenance; "
            "pin_kernel_path('default', os.environ); p = provenance(); "
            "print(p['pinned_kernel_path'], p['mkl_cbwr'], p['cpu_capability'], 'torch' in sys.modules); "
            "import torch; print(torch.backends.cpu.get_cpu_capability())")
    env = {k: v for k, v in os.environ.items() if k not in PIN_NAMES}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout.split()
    assert out == ["default", "COMPATIBLE", "None", "False", "DEFAULT"]
    assert {"pinned_kernel_path", "mkl_cbwr", "cpu_capability"} <= set(provenance())


def test_each_kernel_path_compiles_into_a_cache_of_its_own():
    """torch.compile's cache (TORCHINDUCTOR_CACHE_DIR) is keyed by the run's kernel path; a folder a
    user named is kept, one pinned for another path (inherited by a Slurm job) is replaced."""
    from pwopsd.runtime import COMPILE_CACHE_ENV, pin_compile_cache

    env = {"TMPDIR": "/scratch"}
    avx2 = pin_compile_cache("avx2", env, ZEN5)
    assert env[COMPILE_CACHE_ENV] == avx2 and avx2.startswith("/scratch/torchinductor_") and avx2.endswith("_avx2")
    host512, host2 = pin_compile_cache(None, {"TMPDIR": "/scratch"}, ZEN5), pin_compile_cache(None, {"TMPDIR": "/scratch"}, ZEN3)
    assert len({avx2, host512, host2, pin_compile_cache("avx512", {"TMPDIR": "/scratch"}, ZEN5)}) == 4
    assert host512.endswith("_host-avx512") and host2.endswith("_host-avx2")
    assert pin_compile_cache(None, {"TMPDIR": "/scratch"}, {"sse2"}).endswith("_host-default")
    inherited = {"TMPDIR": "/scratch", COMPILE_CACHE_ENV: avx2}  # the submitting host's pin, on a node without it
    assert pin_compile_cache(None, inherited, ZEN5) == host512 == inherited[COMPILE_CACHE_ENV]
    own = {COMPILE_CACHE_ENV: "/scratch/my-cache"}
    assert pin_compile_cache("avx2", own, ZEN5) == "/scratch/my-cache" == own[COMPILE_CACHE_ENV]


# What a job computes with torch.compile on CPU: vLLM's unseeded draw (its CPU sampler compiles
# softmax, exponential noise and argmax; vllm.v1.sample.ops.topk_topp_sampler).
COMPILED_DRAW = """
import os, sys, torch
from pwopsd.runtime import pin_compile_cache, pin_kernel_path
path, _ = pin_kernel_path(sys.argv[1])  # as workflow/rules/common.smk does for every job
pin_compile_cache(path)
@torch.compile(dynamic=True)
def draw(logits):
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    q = torch.empty_like(probs)
    q.exponential_()
    return probs.div(q).argmax(dim=-1), q
torch.manual_seed(0)
q = torch.cat([draw(torch.randn(rows, 1000))[1].flatten() for rows in (4, 8)])
print(torch.backends.cpu.get_cpu_capability(), float(q.mean()), float(q.min()))
"""


@pytest.mark.slow
@pytest.mark.heavy  # two torch.compile builds: about 40 s of CPU
def test_a_kernel_compiled_on_one_path_is_not_loaded_on_another(tmp_path):
    """torch 2.13 keys inductor's cache without the instruction set: on an AVX512 host, a run on
    torch's own path and then one pinned to avx2 sharing the cache drew noise with mean 0.5 and
    values of 1e-31 (vLLM's unseeded samples became garbage, exit 0); in the other order it crashed.
    With the pinned caches both runs draw Exp(1) noise. The order tested is the one that gave garbage
    with exit 0 (a third run, back on the host's path, added 20 CPU-s and a minute of CI for the
    order that crashes). On an AVX2-only host both paths compile the same code."""
    if "avx2" not in cpu_flags() or shutil.which("g++") is None and shutil.which("c++") is None:
        # every CI host kind is x86-64 with AVX2 and gcc: there a skip would hide the check
        unavailable("needs an x86-64 host with AVX2 and a C++ compiler (inductor's CPU code)")
    env = {k: v for k, v in os.environ.items() if k not in PIN_NAMES | {"TORCHINDUCTOR_CACHE_DIR"}}
    env["TMPDIR"] = str(tmp_path)  # the caches live here, not in the user's

    def draw(path):
        out = subprocess.run([sys.executable, "-c", COMPILED_DRAW, path], capture_output=True, text=True,
                             env=env, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        capability, mean, low = out.stdout.split()
        return capability, float(mean), float(low)

    for path in ("host", "avx2"):
        capability, mean, low = draw(path)
        assert abs(mean - 1) < 0.1 and low > 1e-9, f"{path} ({capability}): Exp(1) noise of mean {mean}, minimum {low}"
    host = os.path.basename(compile_cache_dir(None))
    # (torch keeps its precompiled headers in its default folder, keyed by their compile flags)
    assert {host, host.rsplit("_", 1)[0] + "_avx2"} <= {p.name for p in tmp_path.glob("torchinductor_*")}
