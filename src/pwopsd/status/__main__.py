"""python -m pwopsd.status: see pwopsd/status/__init__.py and docs/status.md."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pwopsd.io import atomic_path
from pwopsd.status import fit as fitmod
from pwopsd.status import render
from pwopsd.status.collect import collect, hours_text


def _plan_vs_spent(status, console) -> None:
    from rich.table import Table

    t = Table(title=f"Planned against spent, finished jobs (accounting: {status.accounting})", title_justify="left")
    for col in ("rule", "model", "jobs", "attempts", "GPUs/job", "planned GPU", "spent GPU", "spent/planned", "job time"):
        t.add_column(col, justify="left" if col in ("rule", "model") else "right")
    for r in fitmod.plan_vs_spent(status):
        ratio = f"{r['spent_gpu_hours'] / r['planned_gpu_hours']:.2f}" if r["planned_gpu_hours"] else "-"
        t.add_row(r["rule"], r["model"], str(r["jobs"]), str(r["attempts"]), str(r["gpus"]),
                  hours_text(r["planned_gpu_hours"]) if r["priced"] else "unpriced", hours_text(r["spent_gpu_hours"]),
                  ratio, render._seconds(r["spent_seconds"]))
    console.print(t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pwopsd.status", description=__doc__)
    ap.add_argument("targets", nargs="*", help="Snakemake targets of the run (default: the workflow's tables, figures "
                    "and report)")
    ap.add_argument("--directory", default=".", help="the run's working directory (snakemake --directory; default .)")
    ap.add_argument("--configfile", action="append", default=[], help="an overlay config file of the run, as snakemake "
                    "--configfile, relative to --directory; repeatable")
    ap.add_argument("--watch", type=float, metavar="SECONDS", help="refresh every SECONDS until interrupted")
    ap.add_argument("--html", metavar="FILE", help="also write the status as one self-contained HTML page")
    ap.add_argument("--json", metavar="FILE", help="also write the status as JSON")
    ap.add_argument("--plan-vs-spent", action="store_true", help="the finished jobs' planned and spent GPU-hours "
                    "per rule and model")
    ap.add_argument("--fit-overlay", metavar="FILE", help="fit the cost assumptions to the finished GPU jobs and write "
                    "them as a config overlay (cluster.cost_assumptions)")
    args = ap.parse_args(argv)
    from rich.console import Console

    directory = Path(args.directory)
    if not (directory / "config" / "config.yaml").exists():
        ap.error(f"{directory / 'config' / 'config.yaml'}: no such file (--directory must be the run's working directory)")
    console = Console(width=None if Console().is_terminal else 160)
    while True:
        status = collect(directory, args.targets, args.configfile)
        if args.watch:
            console.clear()
        render.terminal(status, console)
        if args.plan_vs_spent or args.fit_overlay:
            _plan_vs_spent(status, console)
        for path, text in ((args.html, lambda: render.page(status)),
                           (args.json, lambda: json.dumps(status.to_json(), indent=1, default=str))):
            if path:
                with atomic_path(path) as tmp:
                    Path(tmp).write_text(text(), encoding="utf-8")
        if args.fit_overlay:
            from pwopsd.config import load_config_files

            cfg = load_config_files([directory / "config" / "config.yaml", *(directory / f for f in args.configfile)])
            new, report = fitmod.fit(status, cfg)
            if not new:
                console.print("no finished GPU job to fit the cost assumptions to; no overlay written")
                return 1
            with atomic_path(args.fit_overlay) as tmp:
                Path(tmp).write_text(fitmod.overlay_text(new, report, status), encoding="utf-8")
            console.print(f"wrote {args.fit_overlay}: " + ", ".join(f"{k}={v:.4g}" for k, v in sorted(new.items()))
                          + f"; |spent - planned| {report['error_before']:.3f} h -> {report['error_after']:.3f} h over "
                          f"{report['jobs']} jobs")
        if not args.watch:
            return 0
        try:
            time.sleep(args.watch)
        except KeyboardInterrupt:
            return 0


if __name__ == "__main__":
    sys.exit(main())
