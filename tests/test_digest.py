"""The digest of a run's results (pwopsd.report.digest): every number of the tables, figure data
and build report, none of the timings; a moved number is named; floats round-trip exactly. On a
small synthetic results folder laid out as a real run's (no tiny run)."""

import json
import os
import struct
import subprocess
import sys

import pytest

from conftest import REPO
from pwopsd.report.digest import PLATFORM, DigestError, collect, compare, count_values, digest_text, platform_lines, write_digest

MAIN = """model,checkpoint,benchmark,metric,mean,std,n_seeds
tiny,opsd,arith_l1,avg,69.791667,3.315927,6
tiny,opsd,mean,avg,29.690000,1.000000,6
tiny,pwopsd,arith_l1,avg,71.000000,0.000000,3
"""
SWEEP = """model,method,metric,benchmark,step,value,eval_step,baseline,delta,rank_holds
tiny,opsd,avg,arith_l1,8,67.187500,False,opsd,,True
tiny,opsd,avg,arith_l1,16,68.500000,True,opsd,,False
"""
CURVES = """run,step,loss,kl
opsd,1,0.32541364431381226,0.3254136920916053
opsd,2,0.28108423948287964,0.28108422712846237
"""
SCHEDULES = """r,pwopsd_moderate
0.000000,0.285569
0.005000,0.287302
"""
PER_SEED = """model,checkpoint,benchmark,seed,metric,value
tiny,opsd,arith_l1,main,avg,74.65277777777777
tiny,opsd,arith_l1,1,avg,73.26388888888889
"""
SUMMARY = """model,checkpoint,benchmark,metric,mean,std,n_seeds
tiny,opsd,arith_l1,avg,69.791667,3.315927,6
"""
REPRODUCTION = """paper_table,model,method,benchmark,metric,mean,std,reproduced,within_spread
Table 2,tiny,opsd,arith_l1,avg,75.000000,0.500000,,
"""
REPRODUCTION_FIGURE = """model,method,benchmark,metric,mean,std
tiny,opsd,arith_l1,avg,69.791667,3.315927
"""
BUILD_REPORT = {
    "cpu_capability": "AVX2", "model": "tiny", "seconds_total": 143.5, "pretraining_steps": 375,
    "dev_accuracy": {"student": {"L1": 0.53, "mean": 0.3566666666666667},
                     "teacher": {"L1": 0.99, "mean": 0.9766666666666666}},
    "dev_checks": [{"step": 300, "passed": False, "quick": {"student": 0.2833}, "full": None},
                   {"step": 325, "passed": True, "quick": {"student": 0.2333}, "full": {"student": 0.3567}}],
    "final_loss": 0.060610720934346315,
    "settings": {"steps": 400, "lr": 0.002, "threads": 2},
    "versions": {"torch": "2.13.0+cpu", "python": "3.11.7"},
}
BRANCH = {
    "counts": {"candidates": 106, "gray": 19}, "positive_rate": 0.7727272727272727, "status": "ok",
    "scores": [{"score": "h_full", "auroc": 0.6426470588235295, "label": "$H$"},
               {"score": "mi", "auroc": 0.5926470588235294, "label": "MI"}],
    "provenance": {"model": "tiny", "versions": {"numpy": "2.4.6"}, "host": "node01"},
    "settings": {"scores": {"n_boot": 2000}},
}
FITTED = {"params": {"s": 0.018442773686798922, "tau": 0.5187077301113558, "w_min": 0.20214643182007352},
          "curve": {"r": [0.0, 0.01], "w": [0.2021, 0.2022]}, "log_likelihood": -491.952302001346,
          "provenance": {"phase": "fit_schedule"}, "settings": {"fit_schedule": {"seed": 0}}}
LOG = [{"step": 1, "loss": 0.32541364431381226, "kl": 0.3254136920916053, "seconds": 1.03, "rollout_seconds": 0.39,
        "sync_seconds": 0.0, "lr": 0.0009583333333333334},
       {"step": 2, "loss": 0.28108423948287964, "kl": 0.28108422712846237, "seconds": 0.96, "rollout_seconds": 0.4,
        "sync_seconds": 0.0, "lr": 0.0009166666666666666}]


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def results(tmp_path):
    """A finished run's results folder in miniature, laid out as results/ of a tiny run."""
    root = tmp_path / "results"
    for name, text in {"main_4b": MAIN, "sweep_main_4b": SWEEP}.items():
        _write(root / "tables" / f"{name}.csv", text)
        _write(root / "tables" / f"{name}.tex", "\\begin{tabular}...\n")
        _write(root / "tables" / f"{name}.provenance.json",
               json.dumps({"rule": "table", "seconds": 3.2, "inputs_sha256": {"a": "ff"}, "n": 7}))
    for name, text in {"training_curves_tiny": CURVES, "pwopsd_schedules": SCHEDULES}.items():
        _write(root / "figures" / f"{name}.csv", text)
        _write(root / "figures" / f"{name}.pdf", "%PDF-1.4\n")
    _write(root / "metrics" / "per_seed.csv", PER_SEED)
    _write(root / "metrics" / "summary.csv", SUMMARY)
    _write(root / "report" / "reproduction.csv", REPRODUCTION)
    _write(root / "report" / "reproduction_figure.csv", REPRODUCTION_FIGURE)
    _write(root / "report" / "reproduction.pdf", "%PDF-1.4\n")
    _write(root / "diagnostic" / "tiny" / "branch_auroc.json", json.dumps(BRANCH))
    _write(root / "diagnostic" / "tiny" / "fitted_schedule.json", json.dumps(FITTED))
    _write(root / "models" / "tiny" / "base.json",
           json.dumps({"kind": "tiny", "model": "tiny", "parameters": 853376, "path": "results/models/tiny/base"}))
    _write(root / "models" / "tiny" / "build_report.json", json.dumps(BUILD_REPORT))
    _write(root / "training" / "tiny" / "opsd" / "train_log.jsonl", "".join(json.dumps(r) + "\n" for r in LOG))
    return root


def _edit(path, old, new):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_collect_picks_every_result_number(results):
    d = collect(results)
    assert d["tables/main_4b"]["tiny|opsd|arith_l1|avg"] == {"mean": 69.791667, "std": 3.315927, "n_seeds": 6}
    assert d["tables/main_4b"]["tiny|opsd|mean|avg"]["mean"] == 29.69
    # a numeric column that identifies rows (the sweep's step) keys them: both steps kept
    assert d["tables/sweep_main_4b"]["tiny|opsd|avg|arith_l1|8"] == {
        "value": 67.1875, "eval_step": False, "delta": None, "rank_holds": True}
    assert d["tables/sweep_main_4b"]["tiny|opsd|avg|arith_l1|16"]["value"] == 68.5
    assert set(d["metrics/per_seed"]) == {"tiny|opsd|arith_l1|main|avg", "tiny|opsd|arith_l1|1|avg"}
    assert d["figures/training_curves_tiny"]["opsd|2"] == {"loss": 0.28108423948287964, "kl": 0.28108422712846237}
    assert set(d["figures/pwopsd_schedules"]) == {"0.000000", "0.005000"}
    assert d["report/reproduction"]["Table 2|tiny|opsd|arith_l1|avg"] == {
        "mean": 75.0, "std": 0.5, "reproduced": None, "within_spread": None}
    assert d["report/reproduction_figure"]["tiny|opsd|arith_l1|avg"] == {"mean": 69.791667, "std": 3.315927}
    assert d["diagnostic/tiny/branch_auroc"] == {
        "counts.candidates": 106, "counts.gray": 19, "positive_rate": 0.7727272727272727,
        "scores[score=h_full].auroc": 0.6426470588235295, "scores[score=mi].auroc": 0.5926470588235294}
    assert d["diagnostic/tiny/fitted_schedule"]["params.tau"] == 0.5187077301113558
    assert d["diagnostic/tiny/fitted_schedule"]["curve.w[1]"] == 0.2022
    assert d["training/tiny/opsd/train_log"]["2"] == {"loss": 0.28108423948287964, "kl": 0.28108422712846237,
                                                      "lr": 0.0009166666666666666}
    build = d["models/tiny/build_report"]
    assert build["pretraining_steps"] == 375
    assert build["dev_accuracy.student.mean"] == 0.3566666666666667
    assert build["dev_checks[step=325].full.student"] == 0.3567
    assert build["dev_checks[step=300].passed"] is False
    assert build["final_loss"] == 0.060610720934346315
    assert count_values(d) == 65


def test_collect_leaves_out_timings_settings_versions_paths_and_provenance(results):
    d = collect(results)
    assert not any("provenance" in name for name in d)
    assert "models/tiny/base" not in d  # a manifest (path, hash), not a result
    assert set(d["models/tiny/build_report"]).isdisjoint({"seconds_total", "cpu_capability", "model"})
    text = digest_text(d)
    for word in ("seconds", "settings", "versions", "2.13.0", "AVX2", "node01", "results/models", "threads"):
        assert word not in text, word
    # a timing that changes leaves the digest as it was; a result that changes does not
    _edit(results / "models" / "tiny" / "build_report.json", '"seconds_total": 143.5', '"seconds_total": 99.0')
    _edit(results / "training" / "tiny" / "opsd" / "train_log.jsonl", '"seconds": 1.03', '"seconds": 7.5')
    assert digest_text(collect(results)) == text
    _edit(results / "models" / "tiny" / "build_report.json", '"pretraining_steps": 375', '"pretraining_steps": 350')
    assert digest_text(collect(results)) != text


def test_compare_names_what_moved_appeared_and_disappeared(results):
    old = collect(results)
    assert compare(old, collect(results)) == []
    _edit(results / "tables" / "main_4b.csv", "tiny,opsd,mean,avg,29.690000", "tiny,opsd,mean,avg,30.120000")
    assert compare(old, collect(results)) == ["tables/main_4b: tiny|opsd|mean|avg mean 29.69 -> 30.12"]
    _edit(results / "tables" / "main_4b.csv", "tiny,pwopsd,arith_l1", "tiny,pwopsd_mild,arith_l1")
    _edit(results / "diagnostic" / "tiny" / "branch_auroc.json", '"gray": 19', '"gray": 19, "diversity": 10')
    (results / "figures" / "pwopsd_schedules.csv").unlink()
    (results / "figures" / "pwopsd_schedules.pdf").unlink()
    assert compare(old, collect(results)) == [
        "tables/main_4b: tiny|opsd|mean|avg mean 29.69 -> 30.12",
        "tables/main_4b: row tiny|pwopsd_mild|arith_l1|avg appeared",
        "tables/main_4b: row tiny|pwopsd|arith_l1|avg disappeared",
        "figures/pwopsd_schedules: disappeared (2 values)",
        "diagnostic/tiny/branch_auroc: counts.diversity appeared (10)",
    ]


def test_compare_is_exact_and_capped():
    old = {"tables/t": {"a": {"x": 1, "y": 0.0, "z": 0.1}}}
    assert compare(old, {"tables/t": {"a": {"x": 1.0, "y": 0.0, "z": 0.1}}}) == ["tables/t: a x 1 -> 1.0"]
    assert compare(old, {"tables/t": {"a": {"x": 1, "y": -0.0, "z": 0.1}}}) == ["tables/t: a y 0.0 -> -0.0"]
    assert compare(old, {"tables/t": {"a": {"x": 1, "y": 0.0, "z": 0.1 + 2 ** -56}}}) == \
        ["tables/t: a z 0.1 -> 0.10000000000000002"]
    many_old = {"tables/t": {f"r{i:03d}": {"v": i} for i in range(100)}}
    many_new = {"tables/t": {f"r{i:03d}": {"v": i + 1} for i in range(100)}}
    lines = compare(many_old, many_new)
    assert len(lines) == 41 and lines[0] == "tables/t: r000 v 0 -> 1" and lines[-1] == "... and 60 more"


def test_floats_round_trip_exactly(results):
    texts = ["0.1", "0.30000000000000004", "1e-300", "1.7976931348623157e+308", "-0.0", "123456789.12345679", "5e-324",
             "0.060610720934346315", "nan", "inf"]
    _write(results / "figures" / "exact.csv", "k,v\n" + "".join(f"r{i},{t}\n" for i, t in enumerate(texts)))
    _write(results / "figures" / "exact.pdf", "%PDF-1.4\n")
    d = collect(results)
    back = json.loads(digest_text(d))
    assert back == d
    for i, t in enumerate(texts[:-2]):
        stored = back["figures/exact"][f"r{i}"]["v"]
        assert struct.pack("<d", stored) == struct.pack("<d", float(t)), t
    assert back["figures/exact"]["r8"]["v"] == "NaN" and back["figures/exact"]["r9"]["v"] == "Infinity"
    assert compare(d, back) == []
    # the text is canonical: the same numbers collected in any order give the same bytes
    shuffled = {name: dict(reversed(list(rows.items()))) for name, rows in reversed(list(d.items()))}
    assert digest_text(shuffled) == digest_text(d)


def test_missing_expected_files_are_named(results):
    (results / "figures" / "training_curves_tiny.csv").unlink()
    with pytest.raises(DigestError, match=r"training_curves_tiny\.csv: file does not exist"):
        collect(results)
    _write(results / "figures" / "training_curves_tiny.csv", CURVES.replace("opsd,2", "gkd,2"))
    with pytest.raises(DigestError, match=r"training/tiny/gkd/train_log\.jsonl: file does not exist"):
        collect(results)
    _write(results / "figures" / "training_curves_tiny.csv", CURVES)
    (results / "models" / "tiny" / "build_report.json").unlink()
    with pytest.raises(DigestError, match=r"build_report\.json: file does not exist"):
        collect(results)
    _write(results / "models" / "tiny" / "build_report.json", json.dumps(BUILD_REPORT))
    (results / "tables" / "sweep_main_4b.csv").unlink()
    with pytest.raises(DigestError, match=r"sweep_main_4b\.csv: file does not exist"):
        collect(results)
    _write(results / "tables" / "sweep_main_4b.csv", SWEEP.replace("step,", "stage,"))
    with pytest.raises(DigestError, match=r"sweep_main_4b\.csv: no column step"):
        collect(results)


def test_write_digest_writes_the_canonical_text(results, tmp_path):
    path = tmp_path / "tiny" / "digest.json"
    d = write_digest(results, path)
    assert path.read_text() == digest_text(d) == digest_text({**collect(results), PLATFORM: d[PLATFORM]})
    assert [p.name for p in path.parent.iterdir()] == ["digest.json"]  # no temporary file left


def test_the_digest_records_the_writing_host_and_a_failed_check_shows_both_platforms(results, tmp_path):
    """Issue 50: a moved number from a new CPU is told apart from one moved by a change of code:
    the digest carries the numeric platform of the host that wrote it (never compared), and the
    check prints it beside this host's, the differences marked."""
    from pwopsd.runtime import numeric_platform

    here = numeric_platform()
    assert here["vendor"] and here["cpu_capability"] and here["torch"] and "mkl" in here
    other = "GenuineIntel" if here["vendor"] == "AuthenticAMD" else "AuthenticAMD"  # a vendor this host is not
    written = {**here, "vendor": other, "model_name": "another CPU", "mkl": "oneMKL 2024.0"}
    d = write_digest(results, tmp_path / "digest.json", platform=written)
    assert compare(d, collect(results)) == []  # the record is not a number of the run
    assert count_values(d) == count_values(collect(results))
    lines = platform_lines(d, here)
    assert f"* vendor: {other} -> {here['vendor']}" in "\n".join(lines)
    assert any(line.strip().startswith("torch:") for line in lines)  # an equal field, unmarked
    assert "records no platform" in "\n".join(platform_lines(collect(results), here))


def _cli(*args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "pwopsd.report.digest", *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=120)


def _main(capsys, *args):
    """The command's ``main`` in this process (its exit status, stdout, stderr): the command itself
    runs for each exit status once above it, as a process of its own."""
    from pwopsd.report.digest import main

    capsys.readouterr()
    try:
        code = main([str(a) for a in args])
    except SystemExit as exc:  # argparse's --help
        code = exc.code
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out.out, out.err)


def test_cli_check_and_update(results, tmp_path, capsys):
    digest = tmp_path / "digest.json"
    run = _cli(results, "--check", digest)  # the command, exit status 1
    assert run.returncode == 1 and "--update" in run.stderr
    run = _main(capsys, results, "--update", digest)
    assert run.returncode == 0, run.stderr
    written = json.loads(digest.read_text())
    assert digest.read_text() == digest_text({**collect(results), PLATFORM: written[PLATFORM]})
    run = _cli(results, "--check", digest)  # the command, exit status 0
    assert run.returncode == 0, run.stdout + run.stderr
    _edit(results / "tables" / "main_4b.csv", "tiny,opsd,mean,avg,29.690000", "tiny,opsd,mean,avg,30.120000")
    run = _main(capsys, results, "--check", digest)
    assert run.returncode == 1
    assert "tables/main_4b: tiny|opsd|mean|avg mean 29.69 -> 30.12" in run.stdout
    assert f"python -m pwopsd.report.digest {results} --update {digest}" in run.stdout
    assert "numeric platform: the digest's (written) -> this host's" in run.stdout
    assert _main(capsys, results, "--update", digest).returncode == 0
    assert _main(capsys, results, "--check", digest).returncode == 0
    run = _cli(tmp_path / "nowhere", "--check", digest)  # the command, exit status 2
    assert run.returncode == 2 and "nowhere" in run.stderr
    run = _main(capsys, "--help")
    assert run.returncode == 0 and "python -m pwopsd.report.digest tiny/results --update tiny/digest.json" in run.stdout
