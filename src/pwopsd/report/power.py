"""How many seeds are enough? Power of the paired comparison, by simulation from finished runs.

    python -m pwopsd.power --directory tiny --model tiny_qwen3 --method pwopsd_moderate --benchmark arith_l1

From the per-problem scores of two methods' finished runs on one benchmark (the per-seed metrics
files of the evaluation), the variance components of their difference are estimated
(:func:`variance_components`):

- ``eval``: the variance of a problem's score between eval seeds of one run (sampling noise);
- ``run``: the variance of a run's mean between training seeds of one method, beyond what the eval
  noise explains (0, and said so, when every method has one run: one run cannot estimate it);
- ``problem``: the variance of the per-problem difference between the methods, beyond the noise.

Then benchmarks of the same size are simulated with a true difference ``delta`` for each number of
training runs per method and eval seeds (:func:`simulate_power`), and each is decided as the
significance tables decide (the mixed model's p below ``alpha``, i.e. its interval excludes 0); the
share decided is the power. The rate at ``delta = 0`` (false positives) is printed beside it: with
one run per method the model cannot include training-seed variance, so it exceeds ``alpha`` when
that variance is not 0; from 3 runs per method it stays at ``alpha`` (docs/decisions.md,
"Significance"). GPU-hours of the seeds come from the cost plan (a training run of the method, an eval seed
of a checkpoint).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from pwopsd.report.significance import compare, run_scores


def variance_components(method: np.ndarray, baseline: np.ndarray) -> dict[str, float]:
    """Variance components (fractions²) from ``[problems, runs, eval seeds]`` scores of two methods."""
    m, b = np.asarray(method, float), np.asarray(baseline, float)
    if m.shape[2] < 2 or b.shape[2] < 2:
        raise ValueError("the eval-seed variance needs at least 2 eval seeds per run")
    eval_var = float(np.mean(np.concatenate([m.var(axis=2, ddof=1).ravel(), b.var(axis=2, ddof=1).ravel()])))
    run_parts = []
    for x in (m, b):
        if x.shape[1] >= 2:  # run means over problems and seeds, minus the eval noise they carry
            run_parts.append(x.mean(axis=(0, 2)).var(ddof=1) - eval_var / (x.shape[0] * x.shape[2]))
    run_var = max(0.0, float(np.mean(run_parts))) if run_parts else 0.0
    d = m.mean(axis=(1, 2)) - b.mean(axis=(1, 2))
    noise = eval_var / (m.shape[1] * m.shape[2]) + eval_var / (b.shape[1] * b.shape[2])
    problem_var = max(0.0, float(d.var(ddof=1)) - noise)
    return {"eval": eval_var, "run": run_var, "problem": problem_var, "run_estimated": bool(run_parts),
            "delta": float(d.mean()), "problems": int(m.shape[0])}


def simulated_scores(rng: np.random.Generator, components: dict, *, delta: float, runs: int, eval_seeds: int,
                     problems: int) -> tuple[np.ndarray, np.ndarray]:
    """One simulated benchmark: ``[problems, runs, eval_seeds]`` scores of a method and a baseline
    whose true difference is ``delta``, with the given variance components (fractions², as
    :func:`variance_components` returns them): the method's effect varies by problem (``problem``),
    each training run has its own level (``run``), each (problem, run, eval seed) its own noise
    (``eval``)."""
    sd_p, sd_r, sd_e = (np.sqrt(components[k]) for k in ("problem", "run", "eval"))
    effect = rng.normal(delta, sd_p, problems)[:, None, None]
    method = effect + rng.normal(0, sd_r, (1, runs, 1)) + rng.normal(0, sd_e, (problems, runs, eval_seeds))
    baseline = rng.normal(0, sd_r, (1, runs, 1)) + rng.normal(0, sd_e, (problems, runs, eval_seeds))
    return method, baseline


def simulate_decisions(components: dict, *, delta: float, runs: int, eval_seeds: int, problems: int,
                       n_sim: int = 300, level: float = 0.95, seed: int = 0) -> dict[str, float]:
    """Over ``n_sim`` simulated benchmarks (:func:`simulated_scores`) compared as the significance
    tables compare (:func:`pwopsd.report.significance.compare`): the share whose interval covers
    the true ``delta`` (``coverage``) and whose p is below 1 - ``level`` (``rejected``: the power,
    or at ``delta`` 0 the false-positive rate)."""
    rng = np.random.default_rng(seed)
    covered = rejected = 0
    for _ in range(n_sim):
        method, baseline = simulated_scores(rng, components, delta=delta, runs=runs, eval_seeds=eval_seeds,
                                            problems=problems)
        c = compare(method, baseline, level=level, scale=1.0)
        covered += c.contains(delta)
        rejected += c.p_value < 1 - level
    return {"coverage": covered / n_sim, "rejected": rejected / n_sim}


def simulate_power(components: dict, *, delta: float, runs: int, eval_seeds: int, problems: int, n_sim: int = 300,
                   level: float = 0.95, seed: int = 0) -> float:
    """Share of ``n_sim`` simulated benchmarks with true difference ``delta`` (a fraction) on which
    the comparison finds a difference (p below 1 - ``level``, i.e. the interval excludes 0)."""
    return simulate_decisions(components, delta=delta, runs=runs, eval_seeds=eval_seeds, problems=problems,
                              n_sim=n_sim, level=level, seed=seed)["rejected"]


def seed_costs(cfg: dict, model: str, method: str) -> tuple[float, float]:
    """GPU-hours of one more training run of ``method`` (train job) and of one more eval seed of
    one checkpoint (generate job), from the cost plan's job estimates."""
    from pwopsd import cost

    gpus = cfg["models"][model]["gpus"]
    train = cost.Job("train", {"model": model, "method": method}, int(gpus["train"]))
    generate = cost.Job("generate", {"model": model, "checkpoint": method, "seed": "1"}, int(gpus["generate"]))
    return (cost.job_hours(train, cfg) * max(train.gpus, 0), cost.job_hours(generate, cfg) * max(generate.gpus, 0))


def load_scores(directory: Path, cfg: dict, model: str, method: str, benchmark: str, metric: str) -> np.ndarray:
    """``[problems, runs, eval seeds]`` of a method from its runs' per-seed metrics files."""
    from pwopsd.config import method_runs, seed_names
    from pwopsd.io import read_json

    runs = method_runs(cfg, method)
    summaries = []
    for run in runs:
        for s in seed_names(cfg):
            path = directory / "results" / "metrics" / model / run / benchmark / f"seed-{s}.json"
            if not path.exists():
                raise SystemExit(f"{path} does not exist: finish the runs first "
                                 f"(snakemake results/metrics/{model}/{run}/{benchmark}/seed-{s}.json)")
            summaries.append(read_json(path))
    return run_scores(summaries, model, runs, benchmark, metric)


def main(argv: list[str] | None = None) -> None:
    from pwopsd.config import load_config_files

    ap = argparse.ArgumentParser(prog="python -m pwopsd.power", description=__doc__.split("\n\n")[0])
    ap.add_argument("--directory", default=".", help="working directory of the finished runs (default .)")
    ap.add_argument("--configfile", action="append", default=[], help="an overlay config, as snakemake --configfile")
    ap.add_argument("--model", required=True)
    ap.add_argument("--method", required=True)
    ap.add_argument("--baseline", default=None, help="default: significance.baseline")
    ap.add_argument("--benchmark", required=True)
    ap.add_argument("--metric", default="avg", choices=["avg", "maj", "pass"])
    ap.add_argument("--delta", type=float, default=None,
                    help="difference to detect, in points (default: the observed one, the gain a table claims)")
    ap.add_argument("--power", type=float, default=0.8)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--runs", type=int, nargs="+", default=[1, 2, 3, 5, 8])
    ap.add_argument("--eval-seeds", type=int, nargs="+", default=[1, 3, 6, 12])
    ap.add_argument("--n-sim", type=int, default=300)
    args = ap.parse_args(argv)
    directory = Path(args.directory)
    cfg = load_config_files([directory / "config" / "config.yaml", *(directory / f for f in args.configfile)])
    baseline = args.baseline or cfg["significance"]["baseline"]
    m = load_scores(directory, cfg, args.model, args.method, args.benchmark, args.metric)
    b = load_scores(directory, cfg, args.model, baseline, args.benchmark, args.metric)
    comp = variance_components(m, b)
    train_h, seed_h = seed_costs(cfg, args.model, args.method)
    if args.delta is None:
        args.delta = round(abs(100 * comp["delta"]), 2) or 1.0
    print(f"{args.method} vs {baseline} on {args.model}/{args.benchmark}, {args.metric}: observed delta "
          f"{100 * comp['delta']:+.2f} points from {m.shape[1]} and {b.shape[1]} runs x {m.shape[2]} eval seeds, "
          f"{comp['problems']} problems")
    print(f"variance components (points²): problem {1e4 * comp['problem']:.3g}, eval seed {1e4 * comp['eval']:.3g}, "
          f"training run {1e4 * comp['run']:.3g}" + ("" if comp["run_estimated"] else
                                                     " (one run per method: not estimable, taken as 0)"))
    print(f"power to detect {args.delta:g} points at alpha {args.alpha:g} (decided as the significance tables: "
          f"the mixed model's p < {args.alpha:g}; false-positive rate at delta 0 beside it)")
    print("| training runs per method | eval seeds | power | false positives | GPU-hours (both methods) |")
    print("|---|---|---|---|---|")
    enough = []
    for r in args.runs:
        for e in args.eval_seeds:
            kw = dict(runs=r, eval_seeds=e, problems=comp["problems"], n_sim=args.n_sim, level=1 - args.alpha)
            power = simulate_power(comp, delta=args.delta / 100, **kw)
            false = simulate_power(comp, delta=0.0, **kw)
            gpu_h = 2 * r * (train_h + e * seed_h)
            print(f"| {r} | {e} | {power:.2f} | {false:.2f} | {gpu_h:.0f} |")
            # a setting whose false positives exceed alpha (one run per method, run variance > 0)
            # finds "differences" that are training-seed noise: not a way to reach the power
            if power >= args.power and false <= args.alpha + 2 * np.sqrt(args.alpha * (1 - args.alpha) / args.n_sim):
                enough.append((gpu_h, r, e))
    if enough:
        gpu_h, r, e = min(enough)
        print(f"cheapest with power >= {args.power:g} and false positives within alpha: {r} training runs x {e} eval "
              f"seeds per method ({gpu_h:.0f} GPU-hours)")
    else:
        print(f"no setting in the grid reaches power {args.power:g} for {args.delta:g} points on this benchmark")


if __name__ == "__main__":
    main()
