"""Where a command's CPU-seconds go, process by process: the finer view behind CI's "time by phase".

Runs the command (e.g. CI on a clean clone) and, once a second, reads every process of the host
(``psutil``: user + system seconds, command line, parent); a process is counted from its start, so
processes older than the command are left out (kernel threads, daemons). Each process is put in
the part of its nearest ancestor whose command line names one (a Snakemake job script's working
directory under pytest's temporary folder: ``tiny`` is the tiny run, ``rehearsal`` the
rehearsal, ...; the outermost such ancestor wins), and the table lists CPU-seconds and processes per part and, for the Snakemake
job scripts, per rule. Processes shorter than the interval may be missed or counted short.

    python benchmarks/process_cpu.py --json cpu.json -- bash -c 'CI=true bash .ci/run'
    python benchmarks/process_cpu.py --read cpu.json        # the table of an earlier run
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
import time

JOB = re.compile(r"pytest-\d+/([\w-]+?)\d*/\.snakemake/scripts/tmp\w*\.(\w+)\.py")
WORKDIR = re.compile(r"pytest-\d+/([\w-]+?)\d*(/|\s|$)")


def sample(cmd: list[str], interval: float) -> tuple[int, list[dict]]:
    import psutil

    seen: dict[tuple[int, float], dict] = {}
    start = time.time()
    proc = subprocess.Popen(cmd)
    while True:
        for p in psutil.process_iter(["pid", "ppid", "name", "cmdline", "cpu_times", "create_time"]):
            info = p.info
            if info["cpu_times"] is None or info["create_time"] < start - 1:
                continue
            rec = seen.setdefault((info["pid"], info["create_time"]), {"pid": info["pid"], "ppid": info["ppid"],
                                                                       "name": info["name"], "cmd": ""})
            rec["cpu"] = info["cpu_times"].user + info["cpu_times"].system
            rec["cmd"] = " ".join(info["cmdline"] or [])[:500] or rec["cmd"]
        if proc.poll() is not None:
            return proc.returncode, list(seen.values())
        time.sleep(interval)


def part_of(rec: dict, by_pid: dict[int, dict]) -> str:
    """The part named by the outermost process, from ``rec`` up, whose command line names one (a
    training job of the vLLM engine tests belongs to them, not to its own temporary folder)."""
    part, seen = "other", set()
    while rec is not None and rec["pid"] not in seen:
        seen.add(rec["pid"])
        cmd = rec["cmd"]
        if "pip install" in cmd or "pip_compileall" in cmd or cmd.split(" ")[0].endswith("/uv"):
            part = "installs (pip, uv, bytecode)"
        elif "tests/vllm_cpu" in cmd:
            part = "vLLM engine tests"
        elif m := WORKDIR.search(cmd):
            part = m.group(1)
        elif cmd.endswith("-m pytest") and part == "other":
            part = "pytest session process"
        rec = by_pid.get(rec["ppid"])
    return part


def table(records: list[dict]) -> list[str]:
    by_pid = {r["pid"]: r for r in records}
    parts, rules = collections.Counter(), collections.Counter()
    counts = collections.Counter()
    for r in records:
        part = part_of(r, by_pid)
        parts[part] += r["cpu"]
        counts[part] += 1
        if m := JOB.search(r["cmd"]):
            rules[f"{m.group(1)}: {m.group(2)}"] += r["cpu"]
    lines = [f"CPU-seconds of the processes started by the command: {sum(parts.values()):,.0f}", "",
             f"{'part':48s} {'CPU s':>8s} {'processes':>9s}"]
    lines += [f"{k:48s} {v:8.1f} {counts[k]:9d}" for k, v in parts.most_common()]
    lines += ["", f"{'Snakemake job scripts (part: rule)':48s} {'CPU s':>8s}"]
    lines += [f"{k:48s} {v:8.1f}" for k, v in rules.most_common(25)]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write every process's record here")
    ap.add_argument("--read", help="print the table of a JSON written by --json")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the command")
    args = ap.parse_args()
    if args.read:
        records, rc = json.load(open(args.read)), 0
    else:
        cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        if not cmd:
            ap.error("give a command after --, or --read")
        rc, records = sample(cmd, args.interval)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(records, f)
    print("\n".join(table(records)))
    sys.exit(rc)


if __name__ == "__main__":
    main()
