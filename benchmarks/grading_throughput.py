"""Grading throughput: a serial signal-timeout grader like the reference's vs pwopsd's pool.

Builds one evaluation seed's worth of samples (7,080 = 500x12 MATH-500 + 3x30x12 AIME 2024,
AIME 2025, HMMT) from the real gold answers in ../shared/data/benchmarks/, each problem's 12
samples mixing exact answers, equivalent re-typesets, wrong answers, unformatted outputs and a few
pathological ones (power towers that hang math-verify, huge exponents), then grades them twice:

1. serially, one sample after another, with the reference grader (``$``-wrapping, ``parse``,
   ``verify(gold, pred, timeout_seconds=5)``, string fallback on exceptions; no caching). Its
   signal timeout cannot stop the power towers, so this baseline runs in a child process and a
   sample still running after --serial-cap seconds is recorded as "did not finish" (the child is
   replaced; the reference would hang for minutes);
2. with ``pwopsd.evaluation.grading.GraderPool`` (worker processes, hard limit, deduplication) using the
   reference's grading options, so verdicts must be identical.

Prints samples/s of each, the ratio, the number of hard-limit timeouts and any disagreement.

    python benchmarks/grading_throughput.py [--workers 2] [--timeout 10] [--serial-cap 30]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import re
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from pwopsd.evaluation.grading import GraderPool, GradingOptions, extract_boxed

BENCH_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "benchmarks"
PATHOLOGICAL = [
    "\\dfrac{5^{\\left(5^{\\left(5^{\\left(5^5\\right)}\\right)} - 4\\right)} - 5}{16}",
    "7^{7^{7^{7^{7}}}}",
    "9^{9^{9^{9}}} - 1",
    "2^{2^{30}}",
    "3^{3^{25}} + 1",
    "10^{10^{12}}",
]


def retypeset(gold: str) -> str:
    s = gold.replace("\\left", "").replace("\\right", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\frac", "\\dfrac")
    s = re.sub(r",(?![\d\\])\s*", ", ", s)
    return f"{s.strip()}.0" if re.fullmatch(r"-?\d+", s.strip()) else s


def wrong(gold: str, other: str) -> str:
    return str(int(gold) + 1) if re.fullmatch(r"-?\d+", gold.strip()) else other


def build_workload(seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for name in ("math500", "aime2024", "aime2025", "hmmt_feb2025"):
        df = pd.read_json(BENCH_DIR / f"{name}.jsonl", lines=True, dtype=False)
        golds = [str(a) for a in df["answer"]]
        for i, gold in enumerate(golds):
            other = golds[(i + 7) % len(golds)]
            kinds = rng.choice(["exact", "retype", "wrong", "unformatted", "truncated"], size=12, p=[0.45, 0.2, 0.2, 0.1, 0.05])
            for j, kind in enumerate(kinds):
                if kind == "exact":
                    text = f"... so the answer is \\boxed{{{gold}}}."
                elif kind == "retype":
                    text = f"Therefore $x = \\boxed{{{retypeset(gold)}}}$"
                elif kind == "wrong":
                    text = f"I get \\boxed{{{wrong(gold, other)}}}"
                elif kind == "unformatted":
                    text = f"The answer is {gold}."
                else:
                    text = f"so \\boxed{{{gold[: max(1, len(gold) // 2)]}"
                rows.append({"benchmark": name, "problem": i, "sample": j, "gold": gold, "text": text})
    work = pd.DataFrame(rows)
    # A few pathological outputs, as a long run of a real model produces now and then: huge powers
    # offered for integer answers (where math-verify evaluates them numerically).
    integer_gold = np.flatnonzero(work["gold"].str.fullmatch(r"-?\d+").to_numpy())
    for k, idx in enumerate(rng.choice(integer_gold, size=len(PATHOLOGICAL), replace=False)):
        work.loc[idx, "text"] = f"\\boxed{{{PATHOLOGICAL[k]}}}"
    return work


def reference_grade_answer(pred, gt) -> bool:
    """The reference implementation's grade_answer, as described in the spec (no caching)."""
    from math_verify import parse, verify

    if pred is None:
        return False
    try:
        p, g = str(pred), str(gt)
        p = p if "$" in p else f"${p}$"
        g = g if "$" in g else f"${g}$"
        return bool(verify(parse(g, fallback_mode="no_fallback"), parse(p, fallback_mode="no_fallback"), timeout_seconds=5))
    except Exception:
        return str(pred).replace("$", "").replace(" ", "").lower().strip() == str(gt).replace("$", "").replace(" ", "").lower().strip()


def _serial_child(conn, pairs, start):
    import math_verify  # noqa: F401

    for k in range(start, len(pairs)):
        pred, gold = pairs[k]
        conn.send((k, reference_grade_answer(pred, gold)))
    conn.send(None)


def serial_baseline(pairs, cap: float):
    """Grade serially in a child process; a sample past ``cap`` seconds is 'did not finish'."""
    ctx = mp.get_context("fork")
    verdicts: list[bool | None] = [None] * len(pairs)
    start, t0 = 0, time.perf_counter()
    while start < len(pairs):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_serial_child, args=(child, pairs, start), daemon=True)
        proc.start()
        last = time.perf_counter()
        while True:
            if parent.poll(max(0.0, cap - (time.perf_counter() - last))):
                msg = parent.recv()
                if msg is None:
                    start = len(pairs)
                    break
                k, ok = msg
                verdicts[k] = ok
                start, last = k + 1, time.perf_counter()
            else:  # the sample at `start` ran past the cap
                proc.kill()
                start += 1
                break
        proc.join()
    return verdicts, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=5.0, help="hard limit per grade of the pool (s)")
    ap.add_argument("--serial-cap", type=float, default=30.0, help="give up on a serial sample after this long (s)")
    args = ap.parse_args()
    if not BENCH_DIR.exists():
        sys.exit(f"benchmark data not found at {BENCH_DIR}")
    work = build_workload()
    preds = [extract_boxed(t) for t in work["text"]]
    golds = list(work["gold"])
    print(f"workload: {len(work)} samples ({sum(p is None for p in preds)} unformatted, "
          f"{len(set(zip(golds, preds)))} distinct (gold, prediction) pairs)")

    import math_verify  # noqa: F401  (import cost outside both timings)

    opts = GradingOptions(string_fallback="exception", gold_wrapping="dollar", empty_box="placeholder")  # the reference grader
    n = len(work)
    patho = {k for k, t in enumerate(work["text"]) if any(p in t for p in PATHOLOGICAL)}
    normal = [k for k in range(n) if k not in patho]
    print(f"{len(patho)} pathological samples")
    results = {}
    for label, idx in (("full workload", list(range(n))), ("without the pathological samples", normal)):
        pairs = [(preds[k], golds[k]) for k in idx]
        serial, t_serial = serial_baseline(pairs, args.serial_cap)
        t0 = time.perf_counter()
        with GraderPool(workers=args.workers, timeout=args.timeout, options=opts) as pool:
            grades = pool.grade_pairs([(g, p) for p, g in pairs])
            stats = dict(pool.stats)
        t_ours = time.perf_counter() - t0
        unfinished = [k for k, v in enumerate(serial) if v is None]
        disagree = [k for k, (s_, g) in enumerate(zip(serial, grades)) if s_ is not None and s_ != g.correct]
        m = len(idx)
        print(f"\n{label} ({m} samples)")
        print(f"  serial signal-timeout grader: {t_serial:7.1f} s {m / t_serial:9.1f} samples/s "
              f"({len(unfinished)} did not finish within {args.serial_cap:.0f} s)")
        print(f"  pwopsd GraderPool, {args.workers} workers: {t_ours:7.1f} s {m / t_ours:9.1f} samples/s "
              f"({stats['timeouts']} hit the {args.timeout:g} s hard limit, {stats['deduplicated']} deduplicated)")
        print(f"  speed-up: {t_serial / t_ours:.2f}x   disagreements where the serial grader finished: {len(disagree)}")
        for k in disagree[:10]:
            print(f"    gold={pairs[k][1]!r} pred={pairs[k][0]!r} serial={serial[k]} ours={grades[k].correct} ({grades[k].status})")
        results[label] = t_serial / t_ours
    return results


if __name__ == "__main__":
    main()
