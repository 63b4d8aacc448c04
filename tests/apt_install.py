"""Installing Debian packages for the test session (the test Slurm's daemons, Chromium): one
installer at a time. The session's background parts run in threads, and two of them used to run
apt-get at once on a machine that had neither package set: the second failed on the lock that the
first held ("Could not get lock /var/lib/apt/lists/lock"), and its tests were skipped (issue 50).
Here a process-wide lock serializes this session's installs, a file lock serializes them with other
test sessions on the machine, and apt-get itself waits for a lock held by any other program."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import threading

_LOCK = threading.Lock()
_updated = False
LOCK_FILE = "/tmp/pwopsd-tests-apt.lock"
WAIT_S = 600  # how long apt-get waits for a lock another program holds
APT = ["apt-get", "-o", f"DPkg::Lock::Timeout={WAIT_S}"]


class AptUnavailable(RuntimeError):
    """The packages are missing and cannot be installed here (the reason is the message)."""


def install(packages: list[str], present: list[str]) -> None:
    """Install ``packages`` unless every program in ``present`` is already on the PATH."""
    if all(shutil.which(p) for p in present):
        return
    if not shutil.which("apt-get") or os.geteuid() != 0:
        raise AptUnavailable(f"{', '.join(packages)}: not installed, and installing needs root and apt-get")
    global _updated
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with _LOCK, open(LOCK_FILE, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if all(shutil.which(p) for p in present):  # another installer of this session got there first
            return
        steps = ([] if _updated else [[*APT, "update", "-qq"]]) + [
            [*APT, "install", "-y", "-qq", "--no-install-recommends", *packages]]
        for cmd in steps:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise AptUnavailable(f"{' '.join(cmd)} failed (exit {proc.returncode}): {proc.stderr[-1500:]}")
            if "update" in cmd:
                _updated = True
