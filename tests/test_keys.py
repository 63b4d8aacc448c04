"""Kept work is keyed by everything that determines it (``pwopsd.keys``, ``pwopsd.io.partial_dir``)
and written by one copy of a job at a time (``pwopsd.io.one_writer``).

The scenario of issue 41: a generation job stops early with shards kept; the model is retrained
into the same path; the rerun must not take the old model's shards for the first problems. Also
for a changed dtype, backend and code. The diagnostic's kept parts and graded pairs use the same
key helper and folder (``test_branch_viability.py``, ``test_grading.py`` resume through them).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from pwopsd import keys
from pwopsd.generation.sampling import SamplingConfig, eval_prompt_ids, generation_identity, sample_benchmark
from pwopsd.io import WriterLockedError, changed_fields, one_writer, partial_dir
from conftest import REPO
from test_sampling import EVAL, CountingBackend


@pytest.fixture
def package_copy(tmp_path, monkeypatch):
    """The package's sources in a folder of their own, read by ``pwopsd.keys`` instead of the real ones."""
    copy = tmp_path / "pwopsd"
    shutil.copytree(keys.PACKAGE_ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(keys, "PACKAGE_ROOT", copy)
    keys.module_closure.cache_clear()
    yield copy
    keys.module_closure.cache_clear()


def test_the_code_digest_changes_with_every_module_the_entry_imports_and_no_other(package_copy):
    entry = "pwopsd.generation.sampling"
    closure = keys.module_closure(entry)
    # imported at function level (sampling loads models lazily) and through the package (generation/__init__)
    assert {"pwopsd.models", "pwopsd.generation", "pwopsd.generation.hf_backend", "pwopsd.prompts"} <= set(closure)
    assert "pwopsd.report.tables" not in closure
    before = keys.code_digest(entry)
    (package_copy / "report" / "tables.py").write_text((package_copy / "report" / "tables.py").read_text() + "\n# x\n")
    assert keys.code_digest(entry) == before
    for module in ("models.py", "generation/__init__.py", "generation/vllm_backend.py"):
        path = package_copy / module
        path.write_text(path.read_text() + "\n_A_FIX = 1\n")
        after = keys.code_digest(entry)
        assert after != before, module
        before = after
    with pytest.raises(ValueError, match="not modules of the package"):
        keys.code_digest("pwopsd.no_such_module")


def test_the_training_code_digest_covers_model_loading_rollout_seeds_and_the_vllm_engine():
    closure = keys.module_closure("pwopsd.training.job")
    for module in ("pwopsd.models", "pwopsd.generation", "pwopsd.generation.vllm_backend", "pwopsd.generation.rollout",
                   "pwopsd.training.loop", "pwopsd.training.losses", "pwopsd.schedule", "pwopsd.prompts"):
        assert module in closure, module


def test_weights_are_identified_by_content_not_by_path(tmp_path):
    model = tmp_path / "merged"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights of the first training")
    (model / ".snakemake_timestamp").write_text("1")  # Snakemake's time stamp in a directory() output: not content
    first = keys.weights_identity({"path": str(model)})
    recorded = keys.content_sha256(keys.folder_files_sha256(model))
    assert first == keys.weights_identity({"path": str(model), "content_sha256": recorded})
    (model / ".snakemake_timestamp").write_text("2")
    assert keys.weights_identity({"path": str(model)}) == first
    (model / "model.safetensors").write_bytes(b"weights of the second training")  # retrained into the same path
    assert keys.weights_identity({"path": str(model)}) != first
    hub = {"path": "x", "hf_id": "Qwen/Qwen3-4B", "revision": "abc", "resolved_commit": "abc", "files_sha256": {"a": "1"}}
    assert keys.weights_identity(hub) != keys.weights_identity({**hub, "resolved_commit": "def"})


def test_changed_fields_name_the_dotted_paths_that_differ():
    old = {"weights": {"content_sha256": "a"}, "dtype": "bfloat16", "code": "1", "sampling": {"n": 12, "seed": 1}}
    new = {"weights": {"content_sha256": "b"}, "dtype": "bfloat16", "code": "2", "sampling": {"n": 12, "seed": 2},
           "engine": {}}
    assert changed_fields(old, new) == ["code", "engine", "sampling.seed", "weights.content_sha256"]
    assert changed_fields(old, old) == []


def _save(model, tokenizer, folder: Path) -> dict:
    if folder.exists():
        shutil.rmtree(folder)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return {"model": "tiny", "path": str(folder)}


CHANGES = {
    "the model retrained into the same path": {},
    "another dtype": {"dtype": "bfloat16"},
    "another backend": {"backend_name": "vllm"},
    "another engine setting": {"max_model_len": 128},
    "changed code": {"code": True},
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_an_interrupted_generation_never_reuses_a_shard_made_under_another_key(change, tmp_path, tiny_tokenizer,
                                                                               random_tiny_model, monkeypatch, caplog):
    import torch

    from pwopsd.models import load_model

    folder = tmp_path / "merged"  # the checkpoint path a merge writes, whatever the training
    manifest = _save(random_tiny_model, tiny_tokenizer, folder)
    problems = [f"Compute {i} + 2." for i in range(6)]
    ids = eval_prompt_ids(tiny_tokenizer, problems, enable_thinking=True, add_special_tokens=False)
    pids = [f"p{i}" for i in range(6)]
    cfg = SamplingConfig.from_evaluation(EVAL, seed=3)
    settings = {"dtype": "float32", "backend_name": "hf", "backend_options": {}}
    out = tmp_path / "gen.parquet"

    def run(backend, **how):
        identity = generation_identity(manifest, **{**settings, **{k: v for k, v in how.items() if k not in ("code", "metadata")}})
        return sample_benchmark(backend, pids, ids, cfg, output=out, metadata=how.get("metadata", {"model": "tiny"}),
                                shard_size=2, identity=identity)

    with pytest.raises(KeyboardInterrupt):  # stopped early with its first two shards kept
        run(CountingBackend(load_model(manifest), tiny_tokenizer, fail_after=2))
    assert len(list(out.parent.glob(".gen.parquet.partial/shards/*/shard-*.parquet"))) == 2

    how = dict(CHANGES[change])
    if change == "the model retrained into the same path":
        torch.manual_seed(99)
        retrained = type(random_tiny_model)(random_tiny_model.config)
        manifest = _save(retrained, tiny_tokenizer, folder)
    if how.get("code"):
        digest = keys.code_digest
        monkeypatch.setattr(keys, "code_digest", lambda *e: "after a fix " + digest(*e))
    model = load_model(manifest)
    rerun = CountingBackend(model, tiny_tokenizer)
    with caplog.at_level(logging.WARNING, logger="pwopsd.io"):
        got = run(rerun, **how)
    assert rerun.calls == 3  # every shard generated again
    clean = sample_benchmark(CountingBackend(model, tiny_tokenizer), pids, ids, cfg, output=tmp_path / "clean.parquet",
                             metadata={"model": "tiny"}, shard_size=2)
    pd.testing.assert_frame_equal(got, clean)
    said = [r.getMessage() for r in caplog.records if "discarding 2 kept shards" in r.getMessage()]
    expected = {"the model retrained into the same path": "identity.weights", "another dtype": "identity.dtype",
                "another backend": "identity.backend", "another engine setting": "identity.engine",
                "changed code": "identity.code"}[change]
    assert len(said) == 1 and expected in said[0], said


RECORDS = {
    "another batch size and memory fraction": {"backend_options": {"hf_batch_size": 2, "gpu_memory_utilization": 0.5}},
    "another Snakemake and Python patch level": {"metadata": {"model": "tiny", "versions": {"snakemake": "99.0", "python": "3.11.99"}}},
    "the same cache mounted elsewhere": {"metadata": {"model": "tiny", "model_path": "/elsewhere/snapshots/x"}},
}


@pytest.mark.parametrize("change", list(RECORDS))
def test_settings_that_change_speed_or_records_keep_the_kept_shards(change, tmp_path, tiny_tokenizer, random_tiny_model):
    """Issue 51: batch sizes and memory fractions (what a user turns after an out-of-memory), the
    workflow engine's version, Python's patch level and the model's absolute path decide no sample:
    a rerun after such a change generates only what was not kept."""
    from pwopsd.models import load_model

    manifest = _save(random_tiny_model, tiny_tokenizer, tmp_path / "merged")
    ids = eval_prompt_ids(tiny_tokenizer, [f"Compute {i} + 2." for i in range(6)], enable_thinking=True, add_special_tokens=False)
    pids = [f"p{i}" for i in range(6)]
    cfg = SamplingConfig.from_evaluation(EVAL, seed=3)
    out = tmp_path / "gen.parquet"
    settings = {"dtype": "float32", "backend_name": "hf", "backend_options": {"hf_batch_size": 8}}
    meta = {"model": "tiny", "versions": {"snakemake": "9.27.1", "python": "3.11.7"}, "model_path": str(tmp_path / "merged")}

    def run(backend, how):
        identity = generation_identity(manifest, **{**settings, **{k: v for k, v in how.items() if k != "metadata"}})
        return sample_benchmark(backend, pids, ids, cfg, output=out, metadata={**meta, **how.get("metadata", {})},
                                shard_size=2, identity=identity)

    with pytest.raises(KeyboardInterrupt):
        run(CountingBackend(load_model(manifest), tiny_tokenizer, fail_after=2), {})
    rerun = CountingBackend(load_model(manifest), tiny_tokenizer)
    run(rerun, RECORDS[change])
    assert rerun.calls == 1  # the two kept shards reused, the third generated


def test_comments_and_docstrings_in_the_ground_floor_modules_keep_every_key(package_copy):
    """Issue 51: one appended comment line in runtime.py, io.py, notice.py or keys.py (or the config
    schema module) changed the keys of train, grade, generate and the diagnostic, so a git pull
    between two attempts of a paper training restarted it at step 0. Keys follow what the code does."""
    entries = ("pwopsd.training.job", "pwopsd.evaluation.pipeline", "pwopsd.generation.sampling", "pwopsd.diagnostic.phases")
    before = {e: keys.code_digest(e) for e in entries}
    for module in ("runtime.py", "io.py", "notice.py", "keys.py", "config/schema.py"):
        path = package_copy / module
        text = path.read_text()
        path.write_text(text.replace('"""', '"""Reworded. ', 1) + "\n# a comment\n\n")
        keys.behaviour_text.cache_clear()
        assert {e: keys.code_digest(e) for e in entries} == before, module
    path = package_copy / "io.py"
    path.write_text(path.read_text() + "\nCHANGED = True\n")  # what runs changes: every key that imports io changes
    keys.behaviour_text.cache_clear()
    assert all(keys.code_digest(e) != before[e] for e in entries)


def test_the_snakefiles_code_params_are_read_back_only_for_the_sources_they_were_computed_from(package_copy, tmp_path,
                                                                                                 monkeypatch):
    """The Snakefile's code params are remembered in .snakemake/ (pwopsd.script_digests): a start
    with the same sources reads them without parsing; any changed module or script, Python
    version, or a broken file makes them computed again, equal to what parsing gives."""
    from pwopsd import script_digests

    scripts = sorted(str(p) for p in (REPO / "workflow" / "scripts").glob("*.py"))
    cache = tmp_path / ".snakemake" / "pwopsd" / "code_digests.json"
    parsed = {s: keys.script_code_digest(s) for s in scripts}
    assert all(parsed.values())
    assert script_digests.script_code_digests(scripts, cache=cache) == parsed and cache.exists()
    real = keys.script_code_digest

    def parse_again(script):
        calls.append(script)
        return real(script)

    calls: list = []
    monkeypatch.setattr(keys, "script_code_digest", parse_again)
    assert script_digests.script_code_digests(scripts, cache=cache) == parsed and calls == []  # read back
    path = package_copy / "runtime.py"  # imported by every script: every digest changes
    path.write_text(path.read_text() + "\nCHANGED = True\n")
    keys.behaviour_text.cache_clear()
    changed = script_digests.script_code_digests(scripts, cache=cache)
    assert len(calls) == len(scripts) and all(changed[s] != parsed[s] for s in scripts)
    assert changed == {s: real(s) for s in scripts}
    calls.clear()
    assert script_digests.script_code_digests(scripts, cache=cache) == changed and calls == []
    monkeypatch.setattr(script_digests, "PYTHON", "3.99")  # ast.dump follows Python's version
    assert script_digests.script_code_digests(scripts, cache=cache) == changed and len(calls) == len(scripts)
    one = tmp_path / "one_script.py"
    one.write_text("from pwopsd.io import read_json\n")
    not_a_mapping = {"package": script_digests.package_fingerprint(), "digests": [hashlib.sha256(one.read_bytes()).hexdigest()]}
    for broken in ("", "{not json", '{"package": 1}', "[]", json.dumps(not_a_mapping)):
        cache.write_text(broken)
        assert script_digests.script_code_digests([one], cache=cache) == {str(one): real(one)}
    before = real(one)
    one.write_text("from pwopsd.io import read_json\nfrom pwopsd.notice import Notice\n")  # the script's own imports
    assert script_digests.script_code_digests([one], cache=cache) == {str(one): real(one)} and real(one) != before
    not_a_folder = tmp_path / "a-file"
    not_a_folder.write_text("")  # the cache cannot be written there: computed, and nothing fails
    assert script_digests.script_code_digests([one], cache=not_a_folder / "c.json") == {str(one): real(one)}


def test_an_unchanged_key_resumes_and_a_folder_without_key_is_discarded(tmp_path, caplog):
    out = tmp_path / "x.parquet"
    first = partial_dir(out, {"a": 1})
    (first / "shard-00000.parquet").write_text("kept")
    assert partial_dir(out, {"a": 1}) == first and (first / "shard-00000.parquet").exists()
    stray = first.parent / "0123456789abcdef"  # an older layout's folder, no key file
    stray.mkdir()
    with caplog.at_level(logging.WARNING, logger="pwopsd.io"):
        partial_dir(out, {"a": 1})
    assert not stray.exists() and "key file is missing" in caplog.text
    assert json.loads((first / "key.json").read_text()) == {"a": 1}


HOLD = """
import sys, time
from pwopsd.io import one_writer
with one_writer(sys.argv[1], "training tiny/opsd"):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_second_copy_of_a_job_stops_at_once_naming_the_first_and_a_killed_holder_frees_the_lock(tmp_path):
    run_dir = tmp_path / "checkpoints" / "0123abcd"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "SLURM_JOB_ID": "4242"})
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.time()
        with pytest.raises(WriterLockedError) as info:
            with one_writer(run_dir, "training tiny/opsd"):
                pytest.fail("a second copy got the lock")
        assert time.time() - started < 5  # at once, not after a wait
        message = str(info.value)
        assert f"pid {holder.pid}" in message and "Slurm job 4242" in message and "training tiny/opsd" in message
        assert "--rerun-incomplete" in message
    finally:
        holder.send_signal(signal.SIGKILL)  # the first copy dies (a node lost, scancel): its lock goes with it
        holder.wait()
    with one_writer(run_dir, "training tiny/opsd") as lock:
        assert f"pid {os.getpid()}" in lock.read_text()


HOLD_WITH_GRADERS = """
import sys, time
from pwopsd.evaluation.grading import GraderPool
from pwopsd.io import one_writer
with one_writer(sys.argv[1], "grading tiny/base"):
    pool = GraderPool(workers=2, timeout=5.0)
    pool.grade_pairs([("2", "2"), ("3", "4")])  # the workers are forked and alive
    print(" ".join(str(w.proc.pid) for w in pool._workers), flush=True)
    time.sleep(600)
"""


def test_a_grade_job_killed_with_its_workers_alive_frees_the_lock_at_once(tmp_path, caplog):
    """The grader pool forks its workers while the job holds its lock; a SIGKILL of the job leaves
    them running (they block SIGTERM and wait on their pipes). The lock is the job's alone, so the
    rerun starts at once, and its log names the holder it took over from (issue 51)."""
    import logging

    out = tmp_path / "grades" / "seed-1.parquet"
    job = subprocess.Popen([sys.executable, "-c", HOLD_WITH_GRADERS, str(out)], stdout=subprocess.PIPE, text=True)
    workers = [int(p) for p in job.stdout.readline().split()]
    try:
        assert len(workers) == 2
        job.send_signal(signal.SIGKILL)
        job.wait()
        for pid in workers:
            os.kill(pid, 0)  # the orphaned workers still live
        started = time.time()
        with caplog.at_level(logging.INFO, logger="pwopsd"):
            with one_writer(out, "grading tiny/base") as lock:
                assert f"pid {os.getpid()}" in lock.read_text()
        assert time.time() - started < 5
        assert "from host" in caplog.text and f"pid {job.pid}" in caplog.text and "which is gone" in caplog.text
    finally:
        for pid in workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_filesystem_without_locks_stops_the_job_naming_the_folder_and_mount(tmp_path, monkeypatch):
    import errno
    import fcntl

    from pwopsd.io import LocksUnavailableError

    def no_locks(*args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "lockf", no_locks)
    with pytest.raises(LocksUnavailableError) as info:
        with one_writer(tmp_path / "out" / "x.parquet", "generation tiny/base"):
            pytest.fail("ran without a lock")
    message = str(info.value)
    assert str(tmp_path / "out") in message and "ENOLCK" in message and "mount /" in message


def test_a_rule_param_follows_the_code_its_script_imports(package_copy):
    """Issue 51: Snakemake's code trigger sees a rule's script only; the Snakefile gives every rule
    the digest of the package code its script imports (``script_code_digest``), so a fix to the
    grading logic reruns finished grade jobs, and a comment reruns nothing."""
    from conftest import REPO

    grade = REPO / "workflow" / "scripts" / "grade.py"
    before = keys.script_code_digest(grade)
    assert before and keys.script_code_digest(REPO / "workflow" / "scripts" / "train.py") != before
    path = package_copy / "evaluation" / "grading.py"
    path.write_text(path.read_text() + "\n# a note\n")
    keys.behaviour_text.cache_clear()
    assert keys.script_code_digest(grade) == before
    path.write_text(path.read_text() + "\nGRADING_FIX = 1\n")
    keys.behaviour_text.cache_clear()
    assert keys.script_code_digest(grade) != before


def test_a_notice_signal_is_only_recorded_in_its_handler_and_said_where_it_is_read(caplog):
    """A signal handler runs between two bytecodes of whatever the main thread does, which can be a
    write to the job's log stream: logging from the handler failed a vLLM generation job on notice
    with "reentrant call inside BufferedWriter" (CI, issue 50's run). The handler records; the
    first read of ``received`` says it in the log, once."""
    from pwopsd.notice import Notice

    with caplog.at_level(logging.WARNING, logger="pwopsd"):
        with Notice() as notice:
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(0.05)
            assert not [r for r in caplog.records if "received" in r.getMessage()]  # nothing from the handler
            assert notice.received == "SIGUSR1" and notice.received == "SIGUSR1"
    said = [r.getMessage() for r in caplog.records if "SIGUSR1 received" in r.getMessage()]
    assert len(said) == 1 and "exit (status 75)" in said[0]
