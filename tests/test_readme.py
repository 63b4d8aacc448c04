"""The README's promises that a file can check: exactly two set-up commands, the second of which is
what CI runs (``.ci/run``), and every page, file and script it names exists."""

from __future__ import annotations

import re

from conftest import REPO

README = (REPO / "README.md").read_text()


def setup_commands() -> list[str]:
    section = README.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S)]


def test_the_readme_has_two_set_up_commands_and_ci_runs_the_second():
    commands = setup_commands()
    assert len(commands) == 2 and all("\n" not in c for c in commands), commands
    install = 'python3 -m venv .venv && .venv/bin/pip install -q -r requirements.lock -e ".[all]" && '
    assert commands[0] == install + ".venv/bin/snakemake --directory tiny"
    assert commands[1] == install + ".venv/bin/python -m pytest"
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == commands[1]  # the last thing CI does is README command 2, verbatim


def test_every_path_the_readme_names_exists():
    named = set(re.findall(r"(?<![\w/.])((?:docs|config|benchmarks|tools|tiny|profiles|envs|src|workflow)/[\w./-]*[\w/])", README))
    named = {p for p in named if not p.startswith("tiny/results")}  # what README command 1 writes
    assert len(named) >= 15, named
    assert not sorted(p for p in named if not (REPO / p).exists())
