"""Is tiny mode's conclusion robust to its own bits? The toy is built again from other build seeds
(``tiny.seed``: another initialisation and pretraining stream, the method left alone), and on each
build every OPSD and PW-OPSD Moderate run (two training seeds each) and the two broken trainings
(OPSD with the teacher prompt without the solution, and teacher = student) are compared with the
base model: Avg@12 gain, mean of the four benchmarks, paired 95% interval over problems (the
learning test's own function, ``pwopsd.report.significance.gains_over_base``).

    python benchmarks/tiny_robustness.py --seeds 0 1 2 3 4 --out docs/tiny_robustness.md

Each build runs the tiny workflow's Table 2 part in its own working directory (``--work``, default
``/tmp/pwopsd-robustness``; finished builds are reused, as any Snakemake run's outputs). About 6 to 8
minutes a build and its six trainings on 2 cores alone (AMD Zen 4, the two-layer toy; the build 3 to
5 of them). The claim
(docs/decisions.md, "Tiny mode: a toy robust to its own bits"): every OPSD / Moderate interval
above 0 on every build, no broken training's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

MODEL = "tiny_qwen3"
BROKEN = {"opsd_no_solution": {"loss": "opsd", "teacher_prompt": "no_solution", "label": "OPSD, no solution"},
          "opsd_teacher_student": {"loss": "opsd", "teacher_prompt": "student", "label": "OPSD, teacher = student"}}
LEARNING_METHODS = ("opsd", "pwopsd_moderate")
CONTROL = "opsd_no_solution"  # the learning runs are also compared with it (the least gain is printed)


def runs_of(cfg: dict, only: set[str] | None = None) -> tuple[list[str], list[str]]:
    from pwopsd.config.design import method_runs

    keep = lambda runs: [r for r in runs if not only or r in only]  # noqa: E731
    return keep(r for m in LEARNING_METHODS for r in method_runs(cfg, m)), keep(BROKEN)


def run_build(seed: int, work: Path, snakemake: str, extra: dict, only: set[str] | None,
              reuse: Path | None) -> tuple[Path, float]:
    """The Table 2 part of the tiny workflow on the build of ``seed`` (its metrics files). With
    ``reuse``, a new work folder starts as a copy of ``reuse/seed-N`` (its build, base model
    evaluations and Snakemake's records): Snakemake then makes again only what the changed
    settings reach, e.g. the trainings and their evaluations for a ``training.*`` change."""
    from pwopsd.config import load_config_files
    from pwopsd.config.files import merge_configs

    if reuse is not None and not work.exists() and (reuse / work.name).is_dir():
        shutil.copytree(reuse / work.name, work, symlinks=True)
    work.mkdir(parents=True, exist_ok=True)
    if not (work / "config").exists():
        shutil.copytree(REPO / "tiny" / "config", work / "config")
    settings = merge_configs({"tiny": {"seed": seed}, "methods": BROKEN}, extra)
    (work / "config" / "robustness.yaml").write_text(yaml.safe_dump(settings))
    cfg = load_config_files([work / "config" / "config.yaml", work / "config" / "robustness.yaml"])  # as Snakemake merges them
    learning, broken = runs_of(cfg, only)
    targets = [f"results/metrics/{MODEL}/{c}/{b}/seed-{s}.json" for c in ["base", *learning, *broken]
               for b in cfg["benchmarks"] for s in ("main", "1", "2")]
    t0 = time.time()
    proc = subprocess.run([snakemake, *targets, "--cores", "2", "--directory", str(work), "--configfile",
                           str(work / "config" / "robustness.yaml"), "--quiet", "progress"],
                          cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"build seed {seed}: snakemake failed ({work}):\n{proc.stderr[-3000:]}")
    return work, time.time() - t0


def gains(work: Path, only: set[str] | None = None) -> tuple[dict, dict, dict]:
    from pwopsd.config import load_config_files
    from pwopsd.report.significance import gains_over_base

    cfg = load_config_files([work / "config" / "config.yaml", work / "config" / "robustness.yaml"])
    learning, broken = runs_of(cfg, only)
    summaries = [json.loads(f.read_text()) for c in ["base", *learning, *broken]
                 for f in sorted((work / "results/metrics" / MODEL / c).glob("*/seed-*.json"))]
    benchmarks = sorted({s["benchmark"] for s in summaries})
    build = json.loads((work / f"results/models/{MODEL}/build_report.json").read_text())
    over_control = gains_over_base(summaries, MODEL, learning, benchmarks, base=CONTROL) if CONTROL in broken else {}
    return (gains_over_base(summaries, MODEL, learning, benchmarks), gains_over_base(summaries, MODEL, broken, benchmarks),
            {**build, "over_control": over_control})


def table(rows: list[tuple[int, dict, dict, dict, float]]) -> list[str]:
    cell = lambda c: f"{c.delta:+.1f} [{c.low:+.1f}, {c.high:+.1f}]"  # noqa: E731
    least = lambda g: cell(min(g.values(), key=lambda c: c.delta)) if g else "-"  # noqa: E731
    names = list(rows[0][1]) + list(rows[0][2])
    out = ["| build seed | steps | dev student (greedy) / teacher | " + " | ".join(names) + " | least run over no solution | holds |",
           "|---|---|---|" + "---|" * len(names) + "---|---|"]
    for seed, learn, broken, build, _ in rows:
        acc = build["dev_accuracy"]
        holds = all(c.low > 0 for c in learn.values()) and not any(c.low > 0 for c in broken.values())
        greedy = f" ({100 * acc['student_greedy']['mean']:.0f})" if "student_greedy" in acc else ""
        out.append(f"| {seed} | {build['pretraining_steps']} | {100 * acc['student']['mean']:.0f}{greedy} / {100 * acc['teacher']['mean']:.0f}% | "
                   + " | ".join(cell(c) for c in [*learn.values(), *broken.values()])
                   + f" | {least(build['over_control'])} | {'yes' if holds else '**no**'} |")
    return out


def main(argv=None) -> int:
    from pwopsd.runtime import numeric_platform

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--work", type=Path, default=Path("/tmp/pwopsd-robustness"))
    parser.add_argument("--snakemake", default=str(Path(sys.executable).with_name("snakemake")))
    parser.add_argument("--out", type=Path, help="also write the table (markdown) here")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                        help="a candidate recipe: a tiny config setting to change, e.g. training.lr=3e-3 (repeatable)")
    parser.add_argument("--reuse", type=Path, metavar="WORK",
                        help="start each new build folder as a copy of WORK/seed-N (its build is made again "
                             "only if the changed settings reach it)")
    parser.add_argument("--runs", nargs="+", metavar="RUN",
                        help="only these runs (e.g. opsd opsd_no_solution): a quicker look at a candidate")
    args = parser.parse_args(argv)
    from pwopsd.config import load_config

    from pwopsd.config.overrides import dotted_overrides

    try:
        extra = dotted_overrides(args.settings, load_config(REPO / "tiny" / "config" / "config.yaml"))
    except ValueError as exc:
        raise SystemExit(f"--set {exc}") from None
    only = set(args.runs or ())
    rows = []
    for seed in args.seeds:
        work, seconds = run_build(seed, args.work / f"seed-{seed}", args.snakemake, extra, only, args.reuse)
        rows.append((seed, *gains(work, only), seconds))
        print(f"build seed {seed}: {seconds:.0f} s", flush=True)
    p, build = numeric_platform(), rows[0][3]  # the host; the path and products the builds ran with
    lines = [f"Avg@12 gain over the base model, mean of the four benchmarks, paired 95% interval; "
             f"{p['vendor']} {p['model_name']}, kernel path {build.get('pinned_kernel_path')}, cpu_matmul "
             f"{build.get('cpu_matmul', 'as the config sets it')}"
             + (f"; changed settings: {', '.join(args.settings)}" if args.settings else "") + ":", "",
             *table(rows), "", f"wall time per build (2 cores): {', '.join(f'{r[4]:.0f} s' for r in rows)}"]
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    ok = all(all(c.low > 0 for c in r[1].values()) and not any(c.low > 0 for c in r[2].values()) for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
