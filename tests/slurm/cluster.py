"""A real single-node Slurm cluster for the tests, from Debian's packages.

slurmctld + slurmd (slurm-wlm 22.05), munge, and slurmdbd with MariaDB for accounting (the Slurm
executor plugin follows jobs with ``sacct`` and validates the account with ``sacctmgr``), with
four fake ``h100`` GPUs (character devices with /dev/null's numbers: Slurm rejects file-less GPUs
and regular files) and two partitions on the one node, ``gpu`` and ``cpu``. Memory limits are
enforced by polling (``JobAcctGatherParams=OverMemoryKill``), so a job over its ``--mem`` is killed
as on a cluster. slurmctld logs at debug level, where its time-limit timer records each warning
signal it sends (``send_job_warn_signal``). Every file lives under one state directory, linked from /etc/slurm/slurm.conf
(Slurm commands inside jobs, such as Snakemake's inner srun, look only there) for as long as the
cluster runs; the daemons are started by hand (no systemd here) and stopped by PID. Needs root
and apt (these CI machines); see docs/cluster.md.

Use::

    cluster = SlurmCluster(tmp_dir)
    cluster.start()          # installs the packages if missing
    env = cluster.env()      # SLURM_CONF for sbatch/sacct/srun
    ...
    cluster.stop()
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

PACKAGES = ["slurm-wlm", "slurmdbd", "munge", "mariadb-server", "mariadb-client"]
SYSTEM_CONF = Path("/etc/slurm/slurm.conf")
MARKER = ".pwopsd-test-cluster"  # beside the configuration files this harness writes
DAEMONS = ["slurmctld", "slurmd", "slurmdbd", "munged", "mariadbd"]


class SlurmUnavailable(RuntimeError):
    """This machine cannot run the test cluster (the reason is the message)."""


def _run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def ensure_packages() -> None:
    from apt_install import AptUnavailable, install

    if os.geteuid() != 0:
        raise SlurmUnavailable("the test cluster needs root (daemons, munge key, device files)")
    try:
        install(PACKAGES, present=DAEMONS)
    except AptUnavailable as exc:
        raise SlurmUnavailable(str(exc)) from None


class SlurmCluster:
    def __init__(self, root: Path, *, gpus: int = 4, account: str = "pwopsd", cluster: str = "pwopsdtest"):
        self.root = Path(root)
        self.gpus, self.account, self.cluster = gpus, account, cluster
        self.node = socket.gethostname().split(".")[0]
        self.conf = self.root / "etc" / "slurm.conf"
        self.pids: dict[str, Path] = {}
        self.db_password = secrets.token_hex(8)

    # -- set-up --------------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self, timeout: float = 60) -> None:
        ensure_packages()
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        closed = [str(p) for p in [self.root, *self.root.parents] if not os.stat(p).st_mode & 0o001]
        if closed:  # munged, mariadbd and slurmdbd run as their own users and must reach their files
            raise RuntimeError(f"the cluster's folder {self.root} is not reachable by other users ({closed[0]})")
        for sub in ("etc", "log", "run", "ctld", "spool", "dev", "mysql"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        for sub in ("log", "run"):  # written by daemons running as slurm and mysql
            (self.root / sub).chmod(0o777)
        try:
            self._start_munge()
            self._start_mariadb(timeout)
            self._write_configs()
            self._link_system_conf()
            self._start_daemon("slurmdbd", ["slurmdbd"])  # reads slurmdbd.conf beside $SLURM_CONF
            self._wait(lambda: self._sacctmgr(["list", "cluster"], check=False).returncode == 0, timeout, "slurmdbd")
            self._sacctmgr(["add", "cluster", self.cluster])
            self._sacctmgr(["add", "account", self.account, f"cluster={self.cluster}", "description=tests", "organization=pwopsd"])
            self._sacctmgr(["add", "user", "root", f"account={self.account}", f"cluster={self.cluster}"])
            self._start_daemon("slurmctld", ["slurmctld", "-f", str(self.conf)])
            self._start_daemon("slurmd", ["slurmd", "-f", str(self.conf)])
            self._wait(self._node_ready, timeout, "the node to become idle")
        except BaseException:
            self.stop()
            raise

    def _start_munge(self) -> None:
        key = Path("/etc/munge/munge.key")
        if not key.exists() or key.stat().st_size < 32:
            key.parent.mkdir(parents=True, exist_ok=True)
            key.write_bytes(secrets.token_bytes(1024))
        shutil.chown(key, "munge", "munge")
        key.chmod(0o400)
        run_dir = Path("/run/munge")
        run_dir.mkdir(parents=True, exist_ok=True)
        shutil.chown(run_dir, "munge", "munge")
        own = self.root / "munge"  # munged insists on files only it can write
        own.mkdir(mode=0o700, exist_ok=True)
        shutil.chown(own, "munge", "munge")
        pid = own / "munged.pid"
        _run(["runuser", "-u", "munge", "--", "munged", f"--pid-file={pid}", f"--log-file={own / 'munged.log'}",
              f"--seed-file={own / 'munged.seed'}"])
        self.pids["munged"] = pid

    def _start_mariadb(self, timeout: float) -> None:
        datadir = self.root / "mysql"
        shutil.chown(datadir, "mysql", "mysql")
        _run(["mariadb-install-db", "--user=mysql", f"--datadir={datadir}", "--auth-root-authentication-method=socket",
              "--skip-test-db"])
        sock_dir = Path("/run/mysqld")
        sock_dir.mkdir(parents=True, exist_ok=True)
        shutil.chown(sock_dir, "mysql", "mysql")
        pid = self.root / "run" / "mariadbd.pid"
        log = open(self.root / "log" / "mariadbd.log", "a")
        subprocess.Popen(["mariadbd", "--user=mysql", f"--datadir={datadir}", "--skip-networking",
                          "--socket=/run/mysqld/mysqld.sock", f"--pid-file={pid}"], stdout=log, stderr=log,
                         start_new_session=True)
        self.pids["mariadbd"] = pid
        sql = (f"CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '{self.db_password}'; "
               "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;")
        self._wait(lambda: subprocess.run(["mariadb", "--socket=/run/mysqld/mysqld.sock", "-u", "root", "-e", sql],
                                          capture_output=True).returncode == 0, timeout, "MariaDB")

    def _write_configs(self) -> None:
        cpus, memory = self._node_resources()
        dev = self.root / "dev"
        for i in range(self.gpus):
            path = dev / f"h100_{i}"
            if not path.exists():
                os.mknod(path, 0o666 | 0o020000, os.makedev(1, 3))  # a character device like /dev/null
        r = self.root
        self.conf.write_text(f"""ClusterName={self.cluster}
SlurmctldHost={self.node}(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
StateSaveLocation={r / 'ctld'}
SlurmdSpoolDir={r / 'spool'}
SlurmctldPidFile={r / 'run' / 'slurmctld.pid'}
SlurmdPidFile={r / 'run' / 'slurmd.pid'}
SlurmctldLogFile={r / 'log' / 'slurmctld.log'}
SlurmctldDebug=debug
SlurmdLogFile={r / 'log' / 'slurmd.log'}
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
MpiDefault=none
ReturnToService=2
MinJobAge=300
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStorageTRES=gres/gpu,gres/gpu:h100
AccountingStorageEnforce=associations
AccountingStoreFlags=job_comment
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=1
JobAcctGatherParams=OverMemoryKill
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory} Gres=gpu:h100:{self.gpus} State=UNKNOWN
PartitionName=gpu Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
PartitionName=cpu Nodes={self.node} MaxTime=INFINITE State=UP
""")
        (r / "etc" / "gres.conf").write_text(
            f"NodeName={self.node} Name=gpu Type=h100 File={dev}/h100_[0-{self.gpus - 1}]\n")
        dbd = r / "etc" / "slurmdbd.conf"
        dbd.write_text(f"""AuthType=auth/munge
DbdHost=localhost
SlurmUser=slurm
PidFile={r / 'run' / 'slurmdbd.pid'}
LogFile={r / 'log' / 'slurmdbd.log'}
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass={self.db_password}
StorageLoc=slurm_acct_db
""")
        shutil.chown(dbd, "slurm", "slurm")
        dbd.chmod(0o600)

    def _link_system_conf(self) -> None:
        (self.conf.parent / MARKER).touch()
        if SYSTEM_CONF.exists() or SYSTEM_CONF.is_symlink():
            if not _ours(SYSTEM_CONF):  # a real installation's configuration: leave it alone
                raise SlurmUnavailable(f"{SYSTEM_CONF} belongs to a Slurm installation of this machine")
            SYSTEM_CONF.unlink()
        SYSTEM_CONF.parent.mkdir(parents=True, exist_ok=True)
        SYSTEM_CONF.symlink_to(self.conf)
        gres = SYSTEM_CONF.parent / "gres.conf"
        if gres.is_symlink():
            gres.unlink()
        if not gres.exists():
            gres.symlink_to(self.conf.parent / "gres.conf")
        self._linked = True

    def _node_resources(self) -> tuple[int, int]:
        out = _run(["slurmd", "-C"]).stdout
        fields = dict(kv.split("=", 1) for kv in out.split() if "=" in kv)
        return int(fields["CPUs"]), int(int(fields["RealMemory"]) * 0.9)

    def _start_daemon(self, name: str, cmd: list[str]) -> None:
        env = self.env()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{name} did not start: {proc.stderr}\n{self.log_tail(name)}")
        self.pids[name] = self.root / "run" / f"{name}.pid"

    def _sacctmgr(self, args: list[str], check: bool = True):
        return subprocess.run(["sacctmgr", "-i", *args], env=self.env(), capture_output=True, text=True, check=check)

    def _node_ready(self) -> bool:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], env=self.env(), capture_output=True, text=True).stdout
        return out.strip().startswith("idle")

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if ready():
                return
            time.sleep(0.5)
        raise RuntimeError(f"timed out waiting for {what}\n{self.log_tail('slurmctld')}\n{self.log_tail('slurmd')}")

    # -- use -----------------------------------------------------------------------------------
    def jobs(self, all_runs: bool = False) -> list[dict]:
        """Every job this cluster ran, as ``sacct`` records it: id, state, exit code, requested
        memory, time limit, allocated TRES, partition, account, seconds it ran, comment (Snakemake's
        rule name), the TRES of its steps and ``cpu_seconds``: the CPU time (user + system) of its
        steps' processes as Slurm's accounting gatherer measured it. A requeued job is one record (its
        last run), or with ``all_runs`` one record a run (``sacct -D``: the first ones ``REQUEUED``)."""
        fields = ["jobid", "state", "exit", "reqmem", "timelimit", "tres", "partition", "account", "elapsed", "comment",
                  "totalcpu"]
        out = subprocess.run(["sacct", "-a", "-n", "-P", "-S", "2000-01-01", *(["-D"] if all_runs else []),
                              "--format=JobID,State,ExitCode,ReqMem,Timelimit,AllocTRES,Partition,Account,ElapsedRaw,"
                              "Comment,TotalCPU"],
                             env=self.env(), capture_output=True, text=True, check=True).stdout
        jobs: list[dict] = []
        for line in out.splitlines():
            row = dict(zip(fields, line.split("|")))
            cpu = slurm_seconds(row.pop("totalcpu", ""))
            if "." in row["jobid"]:  # a step of the job record before it
                run = next(j for j in reversed(jobs) if j["jobid"] == row["jobid"].split(".")[0])
                run["steps"].append(row["tres"])
                run["cpu_seconds"] += cpu
            else:
                if not all_runs:
                    jobs = [j for j in jobs if j["jobid"] != row["jobid"]]
                jobs.append({**row, "state": row["state"].split()[0], "steps": [], "cpu_seconds": 0.0})
        return jobs

    def log_tail(self, name: str, n: int = 4000) -> str:
        path = self.root / "log" / f"{name}.log"
        return f"--- {path}:\n{path.read_text()[-n:]}" if path.exists() else f"--- {path}: none"

    # -- tear-down -----------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop every daemon this cluster started, by PID, in reverse order of start, and remove the
        links from /etc/slurm."""
        for name in ["slurmd", "slurmctld", "slurmdbd", "mariadbd", "munged"]:
            pid_file = self.pids.get(name)
            if pid_file is None or not pid_file.exists():
                continue
            try:
                pid = int(pid_file.read_text().split()[0])
            except (ValueError, IndexError):
                continue
            for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    break
                deadline = time.time() + wait
                while time.time() < deadline and _alive(pid):
                    time.sleep(0.1)
                if not _alive(pid):
                    break
        if getattr(self, "_linked", False):
            _unlink_links_into(self.root)
            self._linked = False

    def running(self) -> list[str]:
        out = []
        for name, pid_file in self.pids.items():
            if pid_file.exists():
                try:
                    if _alive(int(pid_file.read_text().split()[0])):
                        out.append(name)
                except (ValueError, IndexError):
                    pass
        return out


def slurm_seconds(text: str) -> float:
    """Seconds of a duration as ``sacct`` prints one (``TotalCPU``, ``Elapsed``:
    ``[D-][HH:]MM:SS[.mmm]``, read by the preflight's reader of Slurm times); empty (no record) is 0."""
    from pwopsd.preflight import limit_minutes

    text = text.strip()
    if not text:
        return 0.0
    if ":" not in text:  # a bare number is a time limit's minutes, never a duration sacct prints
        raise ValueError(f"not a Slurm duration: {text!r}")
    return 60 * limit_minutes(text)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) counts as stopped
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except OSError:
        return False


def unlink_stale_system_conf(system_conf: Path = SYSTEM_CONF) -> list[Path]:
    """Remove the links from /etc/slurm to a test cluster that no longer runs, and return them.

    A session killed before its tear-down (SIGKILL, a lost machine) leaves them behind. Then every
    Snakemake start on this machine waits about 9 s: the Slurm executor plugin asks ``scontrol show
    config`` when it is imported (for a help text), and scontrol retries the controller the link
    names until it gives up (without the link it fails at once). That made the fast tier 2.2x
    slower (470 s against 212 s). Removed: links whose cluster folder is gone, and links to a
    cluster whose slurmctld PID file names a process that is not alive. Left alone: a running
    cluster's links, a starting one's (no PID file yet: another session may be starting it), links
    this harness did not write (no marker beside their target) and a real installation's files."""
    if not _ours(system_conf):
        return []
    target = system_conf.resolve()
    if target.exists():  # the cluster's folder is there: stale only once its slurmctld ran and is gone
        try:
            if _alive(int((target.parent.parent / "run" / "slurmctld.pid").read_text().split()[0])):
                return []
        except (OSError, ValueError, IndexError):
            return []  # no PID yet: a cluster starting (in another session), left alone
    return _unlink_links_into(target.parent.parent, system_conf)


def _ours(system_conf: Path) -> bool:
    """Whether ``system_conf`` is a link this harness wrote: to a configuration with its marker
    beside it, or to one that is gone (a removed cluster folder)."""
    return system_conf.is_symlink() and (not system_conf.exists() or (system_conf.resolve().parent / MARKER).exists())


def _unlink_links_into(root: Path, system_conf: Path = SYSTEM_CONF) -> list[Path]:
    """Remove the links of /etc/slurm (``system_conf`` and the ``gres.conf`` beside it) that point
    into a cluster folder ``root``; return them."""
    removed = []
    for link in (system_conf, system_conf.parent / "gres.conf"):
        if link.is_symlink() and str(root) in os.readlink(link):
            link.unlink(missing_ok=True)
            removed.append(link)
    return removed
