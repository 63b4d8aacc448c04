"""The two faces of a run's status: rich tables for a terminal and one self-contained HTML page
(no script, no external file: it can be copied to a laptop and opened)."""

from __future__ import annotations

import html
import time
from collections import Counter

from pwopsd.status.collect import STATES, Status, hours_text

COLORS = {"done": "#2e7d32", "running": "#1565c0", "queued": "#f9a825", "failed": "#c62828", "waiting": "#b0bec5",
          "planned": "#90a4ae", "spent": "#6a1b9a"}


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def _seconds(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s:.0f} s" if s < 600 else hours_text(s / 3600.0)


def waits_on(status: Status, keys: list[str]) -> str:
    """The rules of a target's unfinished jobs, with counts (``train 3, generate 5``)."""
    jobs = status.by_key()
    left = Counter(jobs[k].rule for k in keys if k in jobs and jobs[k].state != "done")
    return ", ".join(f"{rule} {n}" for rule, n in left.most_common())


def target_rows(status: Status) -> list[dict]:
    rows = []
    for target in status.targets:
        keys = status.target_jobs.get(target, [])
        counts = status.counts(keys)
        rows.append({"target": target, "jobs": len(keys), **counts, "waits_on": waits_on(status, keys)})
    return rows


def running_rows(status: Status) -> list[dict]:
    out = []
    for job in status.jobs:
        if job.state in ("running", "queued") and job.attempts:
            att = job.attempts[-1]
            out.append({"job": job.key, "state": job.state, "attempt": att.number, "slurm_jobid": att.slurm_jobid or "-",
                        "since": _when(att.start), "seconds": att.seconds, "gpus": att.gpus})
    return out


def summary_line(status: Status) -> str:
    c = status.counts()
    inv = status.invocations[-1] if status.invocations else None
    if inv is None:
        run = "no recorded Snakemake run (jobs shown from their outputs and benchmark files)"
    else:
        alive = {True: "running", False: "ended", None: "started on another host, not closed"}[inv["alive"]]
        run = f"{len(status.invocations)} Snakemake run(s), the last {alive} (started {_when(inv['start'])})"
    return (f"{len(status.jobs)} jobs: " + ", ".join(f"{c[s]} {s}" for s in STATES) + f"; {run}; accounting: "
            f"{status.accounting}")


def rerun_line(status: Status) -> str:
    """The finished jobs Snakemake will make again, with its reasons, counted ('' when none)."""
    again = [j for j in status.jobs if j.rerun]
    if not again:
        return ""
    why = Counter(j.rerun.split(":")[0].strip() for j in again)
    return (f"{len(again)} finished job(s) will be made again (shown waiting): "
            + "; ".join(f"{n} x {reason}" for reason, n in why.most_common()))


def uses_gpus(status: Status) -> bool:
    return any(j.gpus for j in status.jobs)


def estimate_line(status: Status) -> str:
    e = status.estimate()
    if not uses_gpus(status):
        done = [j for j in status.jobs if j.state == "done"]
        return (f"no job holds GPUs: {_seconds(e['spent_seconds'])} of job time spent, {len(done)} of "
                f"{len(status.jobs)} jobs done")
    ratio = e["spent_over_planned"]
    left = (f"about {hours_text(e['hours_left'])} at the {e['gpus_running']} GPUs running now" if e["hours_left"] is not None
            else "no GPU job running to estimate the time left from")
    return (f"plan {hours_text(e['planned_gpu_hours'])} GPU, spent {hours_text(e['spent_gpu_hours'])} GPU "
            f"({_seconds(e['spent_seconds'])} of jobs); plan left {hours_text(e['remaining_planned_gpu_hours'])} GPU"
            + (f", x{ratio:.2f} as finished GPU jobs ran = {hours_text(e['remaining_corrected_gpu_hours'])}" if ratio else "")
            + f"; {left}")


# -- terminal ------------------------------------------------------------------------------------

def terminal(status: Status, console=None, failures: int = 20) -> None:
    from rich.console import Console
    from rich.markup import escape as x  # paths, reasons and log lines are text, not markup ("[rank0]: ...")
    from rich.table import Table

    console = console or Console(width=None if Console().is_terminal else 160)
    console.print(f"[bold]{x(status.directory)}[/bold]  {_when(status.taken)}")
    console.print(x(summary_line(status)))
    if rerun_line(status):
        console.print(f"[yellow]{x(rerun_line(status))}[/yellow]")
    t = Table(title="Targets", title_justify="left")
    for col in ("target", "done", "running", "queued", "failed", "waiting", "waits on"):
        t.add_column(col, justify="right" if col in STATES else "left")
    for r in target_rows(status):
        done = f"{r['done']}/{r['jobs']}"
        t.add_row(x(r["target"]), f"[green]{done}[/green]" if r["done"] == r["jobs"] else done,
                  *(str(r[s]) for s in STATES[1:]), x(r["waits_on"]))
    console.print(t)
    run = running_rows(status)
    if run:
        t = Table(title="Running and queued", title_justify="left")
        for col in ("job", "state", "attempt", "Slurm job", "since", "for", "GPUs"):
            t.add_column(col)
        for r in run:
            t.add_row(x(r["job"]), r["state"], str(r["attempt"]), x(r["slurm_jobid"]), r["since"], _seconds(r["seconds"]),
                      str(r["gpus"]))
        console.print(t)
    gpu = uses_gpus(status)
    t = Table(title=f"Spend against the plan ({'GPU-hours' if gpu else 'job time: no job holds GPUs'}; accounting: "
                    f"{status.accounting})", title_justify="left")
    cols = ("rule", "model", "jobs done", "attempts", *(("planned GPU", "spent GPU", "spent/planned", "plan left") if gpu else ()),
            "job time")
    for col in cols:
        t.add_column(col, justify="left" if col in ("rule", "model") else "right")
    for r in status.spend():
        ratio = (f"{r['spent_gpu_hours'] / r['planned_gpu_hours']:.2f}" if r["planned_gpu_hours"] and r["done"] else "-")
        gpu_cols = ((hours_text(r["planned_gpu_hours"]) if r["priced"] else "unpriced", hours_text(r["spent_gpu_hours"]),
                     ratio, hours_text(r["remaining_gpu_hours"])) if r["gpus"] else ("-",) * 4) if gpu else ()
        t.add_row(x(r["rule"]), x(r["model"]), f"{r['done']}/{r['jobs']}", str(r["attempts"]), *gpu_cols,
                  _seconds(r["spent_seconds"]))
    console.print(t)
    console.print(x(estimate_line(status)))
    fails = status.failures()
    if fails:
        t = Table(title=f"Failures and interruptions ({len(fails)}; resubmitted after a notice or requeue: "
                        f"{status.resubmissions_after_notice()})", title_justify="left", show_lines=True)
        for col in ("job", "attempt", "Slurm job", "state", "exit", "reason", "last lines of its log"):
            t.add_column(col)
        for job, att in fails[-failures:]:
            t.add_row(x(job.key), str(att.number), x(att.slurm_jobid or "-"), att.state, x(att.exit_code or "-"), x(att.reason),
                      x((f"{att.log}:\n" if att.log else "") + "\n".join(att.log_tail)))
        console.print(t)


# -- HTML ----------------------------------------------------------------------------------------

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:24px 0 8px}
.meta{color:#555;font-size:13px}
table{border-collapse:collapse;font-size:13px;width:100%}
th,td{border-bottom:1px solid #e0e0e0;padding:4px 8px;text-align:left;vertical-align:top}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.bar{display:flex;height:16px;width:320px;background:#eceff1;border-radius:3px;overflow:hidden}
.bar div{height:100%}
.legend span{display:inline-block;margin-right:14px;font-size:12px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle}
pre{margin:0;font-size:11px;white-space:pre-wrap;color:#444}
"""


def _bar(counts: dict, total: int) -> str:
    parts = "".join(f'<div class="{s}" style="width:{100.0 * counts[s] / total:.3f}%;background:{COLORS[s]}" '
                    f'title="{counts[s]} {s}"></div>' for s in STATES if total and counts[s])
    return f'<div class="bar">{parts}</div>'


def _spend_chart(rows: list[dict], gpu: bool) -> str:
    """Horizontal bars per rule and model: planned and spent (GPU-hours, or job-seconds when no job
    holds GPUs), on one scale."""
    key_p, key_s = ("planned_gpu_hours", "spent_gpu_hours") if gpu else (None, "spent_seconds")
    rows = [r for r in rows if (r[key_s] or (key_p and r[key_p]))]
    if not rows:
        return "<p class=meta>Nothing spent or planned yet.</p>"
    top = max(max(r[key_s], r[key_p] if key_p else 0.0) for r in rows) or 1.0
    width, label, bar_h, gap = 900, 260, 10, 8
    step = 2 * bar_h + gap if key_p else bar_h + gap
    height = step * len(rows) + 24
    unit = (lambda v: hours_text(v)) if gpu else (lambda v: _seconds(v))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
           f'aria-label="spend against plan">']
    for i, r in enumerate(rows):
        y = i * step
        out.append(f'<text x="{label - 8}" y="{y + bar_h + 2}" font-size="12" text-anchor="end">'
                   f'{html.escape(r["rule"])} {html.escape(r["model"])}</text>')
        bars = ([("planned", r[key_p])] if key_p else []) + [("spent", r[key_s])]
        for j, (name, value) in enumerate(bars):
            w = (width - label - 90) * value / top
            out.append(f'<rect class="{name}" x="{label}" y="{y + j * bar_h}" width="{w:.1f}" height="{bar_h - 1}" '
                       f'fill="{COLORS[name]}"><title>{name} {unit(value)}</title></rect>')
            out.append(f'<text x="{label + w + 4:.1f}" y="{y + j * bar_h + bar_h - 1}" font-size="10">{unit(value)}</text>')
    out.append("</svg>")
    return "".join(out)


def page(status: Status) -> str:
    e = html.escape
    c = status.counts()
    gpu = uses_gpus(status)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>pwopsd run status</title><style>{CSS}</style>"
             "</head><body>",
             f"<h1>Run status: {e(status.directory)}</h1>",
             f"<div class=meta>taken {_when(status.taken)} &middot; {e(summary_line(status))}</div>",
             *([f"<div class=meta>{e(rerun_line(status))}</div>"] if rerun_line(status) else []),
             "<div class=legend>" + "".join(f"<span><i style='background:{COLORS[s]}'></i>{s} {c[s]}</span>" for s in STATES)
             + "</div>", _bar(c, len(status.jobs)),
             "<h2>Progress per target</h2><table><tr><th>target</th><th>progress</th><th>done</th><th>running</th>"
             "<th>queued</th><th>failed</th><th>waiting</th><th>waits on</th></tr>"]
    for r in target_rows(status):
        parts.append(f"<tr><td>{e(r['target'])}</td><td>{_bar(r, r['jobs'])}</td><td class=n>{r['done']}/{r['jobs']}</td>"
                     + "".join(f"<td class=n>{r[s]}</td>" for s in STATES[1:]) + f"<td>{e(r['waits_on'])}</td></tr>")
    parts.append("</table>")
    run = running_rows(status)
    if run:
        parts.append("<h2>Running and queued</h2><table><tr><th>job</th><th>state</th><th>attempt</th><th>Slurm job</th>"
                     "<th>since</th><th>for</th><th>GPUs</th></tr>")
        parts += [f"<tr><td>{e(r['job'])}</td><td>{r['state']}</td><td class=n>{r['attempt']}</td><td>{r['slurm_jobid']}</td>"
                  f"<td>{r['since']}</td><td class=n>{_seconds(r['seconds'])}</td><td class=n>{r['gpus']}</td></tr>" for r in run]
        parts.append("</table>")
    what = "GPU-hours" if gpu else "job-seconds (no job holds GPUs)"
    parts.append(f"<h2>Spend against the plan ({what}; accounting: {e(status.accounting)})</h2>"
                 "<div class=legend>" + "".join(f"<span><i style='background:{COLORS[s]}'></i>{s}</span>"
                                                for s in (("planned", "spent") if gpu else ("spent",))) + "</div>")
    parts.append(_spend_chart(status.spend(), gpu))
    parts.append(f"<p class=meta>{e(estimate_line(status))}</p>")
    gpu_head = "<th>planned GPU</th><th>spent GPU</th><th>plan left</th>" if gpu else ""
    parts.append(f"<table><tr><th>rule</th><th>model</th><th>jobs done</th><th>attempts</th>{gpu_head}<th>job time</th></tr>")
    for r in status.spend():
        gpu_cells = ("<td class=n>-</td>" * 3 if not r["gpus"] else
                     f"<td class=n>{hours_text(r['planned_gpu_hours']) if r['priced'] else 'unpriced'}</td>"
                     f"<td class=n>{hours_text(r['spent_gpu_hours'])}</td><td class=n>{hours_text(r['remaining_gpu_hours'])}</td>"
                     ) if gpu else ""
        parts.append(f"<tr><td>{e(r['rule'])}</td><td>{e(r['model'])}</td><td class=n>{r['done']}/{r['jobs']}</td>"
                     f"<td class=n>{r['attempts']}</td>{gpu_cells}<td class=n>{_seconds(r['spent_seconds'])}</td></tr>")
    parts.append("</table>")
    fails = status.failures()
    parts.append(f"<h2>Failures and interruptions ({len(fails)}; resubmitted after a notice or requeue: "
                 f"{status.resubmissions_after_notice()})</h2>")
    if fails:
        parts.append("<table><tr><th>job</th><th>attempt</th><th>Slurm job</th><th>state</th><th>exit</th><th>reason</th>"
                     "<th>last lines of its log</th></tr>")
        for job, att in fails:
            parts.append(f"<tr class=failure><td>{e(job.key)}</td><td class=n>{att.number}</td><td>{e(att.slurm_jobid or '-')}</td>"
                         f"<td>{e(att.state)}</td><td>{e(att.exit_code or '-')}</td><td>{e(att.reason)}</td>"
                         f"<td><pre>{e((att.log + chr(10)) if att.log else '')}{e(chr(10).join(att.log_tail))}</pre></td></tr>")
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)
