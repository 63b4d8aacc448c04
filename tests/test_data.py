"""Dataset preparation: the real benchmark files as local sources, checksums, column mapping,
the offline Hub path, and the deterministic tiny generator."""

import shutil

import pandas as pd
import pytest

from conftest import BENCHMARKS, require_shared
from pwopsd.data import DataError, prepare_dataset
from pwopsd.io import read_parquet_metadata, sha256_file, write_parquet

# SHA-256 sums recorded in ../shared/data/benchmarks/PROVENANCE.md
REAL = {
    "math500.jsonl": (500, "26784b352bc0a7f27474dbae80702b7ba3e2f50258db837e4d550d20f06e175b"),
    "aime2024.jsonl": (30, "922666844c8c8561b19612c2b9ff0af2195042206444f0d716384d0e68b3a182"),
    "aime2025.jsonl": (30, "bf5be630130b798d0ef79410b74d2c47cb9a43c3187e61d9d906ff0794fbe1ea"),
    "hmmt_feb2025.jsonl": (30, "e9c3ec177bd8c251129eec87174e996c320e78600010ed3e4f1de6349b1a60e2"),
}


@pytest.mark.parametrize("fname", sorted(REAL))
def test_real_benchmark_files_load_with_checksum(fname):
    path = require_shared(BENCHMARKS / fname)
    rows, digest = REAL[fname]
    entry = {"source": {"kind": "local", "path": str(path), "sha256": digest}, "columns": {}, "expected_rows": rows}
    df, manifest = prepare_dataset(entry, f"benchmarks.{fname.split('.')[0]}")
    assert len(df) == rows and df["id"].is_unique
    assert list(df.columns[:3]) == ["id", "problem", "answer"]
    assert (df["answer"].str.len() > 0).all() and (df["problem"].str.len() > 0).all()
    assert manifest["source"]["sha256"] == digest and manifest["source"]["sha256_verified"]
    assert manifest["rows"] == rows


def test_math500_fields_and_first_row():
    path = require_shared(BENCHMARKS / "math500.jsonl")
    entry = {"source": {"kind": "local", "path": str(path)}, "columns": {"id": "unique_id", "solution": "solution"}}
    df, _ = prepare_dataset(entry, "benchmarks.math500")
    assert df.loc[0, "id"] == "test/precalculus/807.json"
    assert df.loc[0, "answer"] == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert {"subject", "level", "solution"} <= set(df.columns)
    assert sorted(df.loc[df["answer"].str.contains(r"\\\$", regex=True), "id"]) == [
        "test/algebra/2626.json", "test/algebra/2780.json", "test/prealgebra/1203.json"]


def test_aime_answers_stay_strings():
    path = require_shared(BENCHMARKS / "aime2024.jsonl")
    df, _ = prepare_dataset({"source": {"kind": "local", "path": str(path)}, "columns": {}}, "benchmarks.aime2024")
    assert df["answer"].map(type).eq(str).all()
    assert df.set_index("id").loc["2024-I-1", "answer"] == "204"
    assert df.set_index("id").loc["2024-I-2", "answer_raw"] == "025"  # source field kept, not coerced


def test_checksum_mismatch_is_a_clear_error(tmp_path):
    src = require_shared(BENCHMARKS / "hmmt_feb2025.jsonl")
    copy = tmp_path / "hmmt.jsonl"
    shutil.copy(src, copy)
    with open(copy, "a") as fh:
        fh.write("\n")  # one byte changed
    entry = {"source": {"kind": "local", "path": str(copy), "sha256": REAL["hmmt_feb2025.jsonl"][1]}, "columns": {}}
    with pytest.raises(DataError, match=r"benchmarks\.hmmt_feb2025\.source\.sha256: checksum mismatch"):
        prepare_dataset(entry, "benchmarks.hmmt_feb2025")


def test_parquet_source_as_the_paper_uses_for_hmmt(tmp_path):
    src = require_shared(BENCHMARKS / "hmmt_feb2025.jsonl")
    raw = pd.read_json(src, lines=True, dtype=False).rename(columns={"problem_number": "problem_idx"}).drop(columns=["id"])
    path = tmp_path / "train.parquet"
    raw.to_parquet(path)
    entry = {"source": {"kind": "local", "path": str(path), "sha256": sha256_file(path)},
             "columns": {"id": "problem_idx"}, "expected_rows": 30}
    df, _ = prepare_dataset(entry, "benchmarks.hmmt_feb2025")
    assert df["id"].tolist()[:3] == ["1", "2", "3"]


def test_missing_file_column_and_rowcount_errors(tmp_path):
    with pytest.raises(DataError, match=r"benchmarks\.x\.source\.path: file .* does not exist"):
        prepare_dataset({"source": {"kind": "local", "path": str(tmp_path / "nope.jsonl")}}, "benchmarks.x")
    path = require_shared(BENCHMARKS / "aime2025.jsonl")
    with pytest.raises(DataError, match=r"benchmarks\.x\.columns\.answer: column 'gold' not in the source"):
        prepare_dataset({"source": {"kind": "local", "path": str(path)}, "columns": {"answer": "gold"}}, "benchmarks.x")
    with pytest.raises(DataError, match=r"benchmarks\.x\.expected_rows: expected 31 rows, the source has 30"):
        prepare_dataset({"source": {"kind": "local", "path": str(path)}, "expected_rows": 31}, "benchmarks.x")


@pytest.mark.parametrize("column,value,words", [
    ("answer", None, "is null"), ("answer", float("nan"), "is null"), ("problem", None, "is null"),
    ("answer", "  ", "is empty"), ("answer", [1, 2], "is not a scalar"), ("problem", {"a": 1}, "is not a scalar")])
def test_null_empty_and_nested_cells_are_rejected_naming_file_row_and_column(tmp_path, column, value, words):
    rows = [{"id": f"p{i}", "problem": f"Compute {i}.", "answer": str(i)} for i in range(3)]
    rows[1][column] = value
    path = tmp_path / "bench.jsonl"
    pd.DataFrame(rows).to_json(path, orient="records", lines=True)
    with pytest.raises(DataError) as info:
        prepare_dataset({"source": {"kind": "local", "path": str(path)}}, "benchmarks.x")
    msg = str(info.value)
    assert f"benchmarks.x: file {path}, row 1 (id 'p1'), column '{column}' ({column}) {words}" in msg, msg


def test_a_benchmark_without_rows_is_rejected(tmp_path):
    path = tmp_path / "empty.parquet"
    pd.DataFrame({"id": pd.Series([], dtype=str), "problem": pd.Series([], dtype=str),
                  "answer": pd.Series([], dtype=str)}).to_parquet(path)
    with pytest.raises(DataError, match=rf"benchmarks\.x: file {path} has no rows"):
        prepare_dataset({"source": {"kind": "local", "path": str(path)}}, "benchmarks.x")


def test_integer_answers_stay_exact(tmp_path):
    path = tmp_path / "ints.jsonl"
    pd.DataFrame([{"id": "a", "problem": "p", "answer": 204}, {"id": "b", "problem": "q", "answer": 7}]).to_json(
        path, orient="records", lines=True)
    df, _ = prepare_dataset({"source": {"kind": "local", "path": str(path)}}, "benchmarks.x")
    assert df["answer"].tolist() == ["204", "7"]


def test_hub_source_offline_fails_with_the_dataset_named(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    entry = {"source": {"kind": "hf", "dataset": "HuggingFaceH4/aime_2024", "split": "train",
                        "revision": "2fe88a2f1091d5048c0f36abc874fb997b3dd99a"}}
    with pytest.raises(DataError, match=r"benchmarks\.aime2024\.source: could not load Hub dataset HuggingFaceH4/aime_2024.*offline"):
        prepare_dataset(entry, "benchmarks.aime2024", hub={"offline": True, "cache_dir": str(tmp_path)})


def test_tiny_source_is_deterministic_and_correct():
    entry = {"source": {"kind": "tiny", "n": 12, "levels": [1, 2, 3], "seed": 5, "max_operand": 30}, "columns": {"solution": "solution"}}
    a, _ = prepare_dataset(entry, "benchmarks.t")
    b, _ = prepare_dataset(entry, "benchmarks.t")
    pd.testing.assert_frame_equal(a, b)
    assert a["level"].tolist() == [1, 2, 3] * 4
    for problem, answer in zip(a["problem"], a["answer"]):
        expr = problem.removeprefix("Compute ").removesuffix(".")
        assert str(eval(expr, {"__builtins__": {}})) == answer  # trusted, generated text
    c, _ = prepare_dataset({**entry, "source": {**entry["source"], "seed": 6}}, "benchmarks.t")
    assert not a["problem"].equals(c["problem"])


def test_parquet_written_atomically_with_metadata(tmp_path):
    out = tmp_path / "t.parquet"
    write_parquet(pd.DataFrame({"a": [1]}), out, metadata={"source": "x"})
    assert read_parquet_metadata(out) == {"source": "x"}
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]  # no temp leftovers


def test_a_tiny_source_leaves_out_a_held_out_sources_problems():
    """source.held_out (config/learning.yaml): the corpus draws again each problem of the held-out
    benchmark, so the two share none; without it the problems are the ones drawn before; a space
    too small for it is an error naming the key."""
    from pwopsd.data import DataError, load_tiny

    bench = {"kind": "tiny", "n": 48, "levels": [1], "seed": 2001, "max_operand": 9, "example": True}
    corpus = {"kind": "tiny", "n": 300, "levels": [1], "seed": 7, "max_operand": 9}
    plain, _ = load_tiny(corpus)
    held = {"n": 48, "levels": [1], "seed": 2001, "max_operand": 9}
    disjoint, meta = load_tiny({**corpus, "held_out": [held]})
    evaluation = {p.split("Now c", 1)[1] for p in load_tiny(bench)[0]["problem"]}
    assert len(disjoint) == 300 and meta["held_out"] == [held]
    assert {p[1:] for p in plain["problem"]} & evaluation  # one-digit sums repeat: without it they overlap
    assert not {p[1:] for p in disjoint["problem"]} & evaluation
    assert plain.equals(load_tiny(corpus)[0])
    with pytest.raises(DataError, match="held_out"):
        load_tiny({"kind": "tiny", "n": 10, "levels": [1], "seed": 7, "max_operand": 1,
                   "held_out": [{"n": 40, "levels": [1], "seed": 1, "max_operand": 1}]})


def test_a_distinct_tiny_source_draws_a_repeated_problem_again():
    """Arith-1's 24 draws hold 19 problems: with ``distinct`` a repeat is drawn again, so the
    benchmark holds 24 (the first 19 in their order, then new ones); too small a space is an error."""
    from pwopsd.data import DataError, load_tiny

    source = {"kind": "tiny", "n": 24, "levels": [1], "seed": 1001, "max_operand": 9, "max_value": 9}
    plain, once = load_tiny(source)[0], load_tiny({**source, "distinct": True})[0]
    assert plain["problem"].nunique() == 19 and once["problem"].nunique() == 24 == len(once)
    firsts = list(dict.fromkeys(plain["problem"]))
    assert list(once["problem"][:19]) == firsts
    with pytest.raises(DataError, match="distinct"):
        load_tiny({"kind": "tiny", "n": 30, "levels": [1], "seed": 1, "max_operand": 2, "max_value": 3, "distinct": True})


def test_a_tiny_sources_numbered_solutions_hold_the_worked_steps_and_answer_in_the_models_own_layout():
    """source.solution: numbered (config/learning.yaml): the worked solution's steps, numbered, then
    a blank line and "So, the answer is \\boxed{...}." (how SmolLM2-135M-Instruct lays out its greedy
    answers); the problems and answers are the worked source's, and the grader reads the same answer."""
    from pwopsd.data import load_tiny
    from pwopsd.evaluation.grading import extract_boxed

    source = {"kind": "tiny", "n": 6, "levels": [1, 2, 3], "seed": 7, "max_operand": 9, "max_value": 9}
    worked, _ = load_tiny(source)
    numbered, meta = load_tiny({**source, "solution": "numbered"})
    assert meta["solution"] == "numbered"
    assert worked[["problem", "answer"]].equals(numbered[["problem", "answer"]])
    for w, n, answer, level in zip(worked["solution"], numbered["solution"], numbered["answer"], numbered["level"]):
        steps = w.splitlines()[:-1]
        assert n.splitlines() == [f"{i}. {s}" for i, s in enumerate(steps, 1)] + ["", f"So, the answer is \\boxed{{{answer}}}."]
        assert len(steps) == level and extract_boxed(n) == extract_boxed(w) == answer
