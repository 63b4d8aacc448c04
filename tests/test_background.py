"""The suite's phase report (tests/background.py): each part's CPU-seconds are those of the
processes it ran and of every process below them (issue 54: CPU time, which parts running beside
it do not move the way they move wall time)."""

from __future__ import annotations

import sys
import threading

import background


def test_a_parts_cpu_seconds_include_its_grandchildren(tmp_path):
    script = tmp_path / "burn.py"
    script.write_text("import subprocess, sys, time\n"
                      "if len(sys.argv) > 1:\n"
                      "    t = time.process_time()\n"
                      "    while time.process_time() - t < 0.6:\n"
                      "        pass\n"
                      "else:\n"
                      "    subprocess.run([sys.executable, __file__, 'child'], check=True)\n")

    def part():
        background._CURRENT.name = "burn test"
        assert background.run_child([sys.executable, str(script)]).returncode == 0

    thread = threading.Thread(target=part)
    thread.start()
    thread.join()
    try:
        assert 0.6 <= background._CPU["burn test"] < 5.0  # the grandchild's 0.6 s, plus two interpreters' starts
    finally:
        background._CPU.pop("burn test", None)
