"""What a GPU job finds on its node, and the rule that a job which asked for GPUs never falls back to
the CPU (issue 52): the NVIDIA driver, the CUDA version each job environment's wheels are built for,
and the rank's own GPU among those Slurm gave the job.

* :func:`require_cuda`: a job that asked for GPUs and finds no usable CUDA stops at once, the driver
  and the toolkit in the message. The CPU path stays for jobs that ask for none (tiny mode, tests).
* :func:`env_cuda` / :func:`driver_problem`: the CUDA runtime pinned in an ``envs/*.yaml`` file and
  whether a driver version can run it (the preflight checks each environment against the node's).
* :func:`rank_device`: the ``CUDA_VISIBLE_DEVICES`` value of a rank's rollout engine: the rank's
  entry of the inherited list, not its index.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

# The oldest Linux driver of each CUDA toolkit release (NVIDIA's CUDA Toolkit release notes, "CUDA
# Toolkit and Corresponding Driver Versions", the toolkit's GA driver). A wheel built for CUDA X.Y is
# checked against X.Y's entry, or the newest entry below it of the same major.
MIN_DRIVER = {
    (12, 4): (550, 54, 14), (12, 6): (560, 28, 3), (12, 8): (570, 26, 0), (12, 9): (575, 51, 3),
    (13, 0): (580, 65, 6),
}

DRIVER_FILE = Path("/proc/driver/nvidia/version")


class NoCudaError(RuntimeError):
    """A job asked for GPUs and finds no usable CUDA."""


def parse_version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def driver_version(run=subprocess.run) -> str | None:
    """The node's NVIDIA driver version (``nvidia-smi``, else the kernel module's file), or None."""
    if shutil.which("nvidia-smi"):
        try:
            out = run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                      text=True, timeout=30)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.split()[0]
        except (OSError, subprocess.TimeoutExpired):
            pass
    try:
        m = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", DRIVER_FILE.read_text())
        return m.group(1) if m else None
    except OSError:
        return None


def env_cuda(env_file: str | Path) -> tuple[int, int] | None:
    """The CUDA major.minor of an environment file's pinned CUDA runtime wheel
    (``nvidia-cuda-runtime[-cuXX]==X.Y.Z``), None when it pins none."""
    m = re.search(r"nvidia-cuda-runtime(?:-cu\d+)?==(\d+)\.(\d+)", Path(env_file).read_text())
    return (int(m.group(1)), int(m.group(2))) if m else None


def min_driver(cuda: tuple[int, int]) -> tuple[int, ...]:
    same_major = [v for v in MIN_DRIVER if v[0] == cuda[0] and v <= cuda]
    if not same_major:
        raise KeyError(f"no known driver minimum for CUDA {cuda[0]}.{cuda[1]}: add it to pwopsd.accelerator.MIN_DRIVER")
    return MIN_DRIVER[max(same_major)]


def driver_problem(driver: str | None, cuda: tuple[int, int], what: str) -> str:
    """Why a driver cannot run wheels built for ``cuda`` ('' when it can)."""
    need = ".".join(map(str, min_driver(cuda)))
    if driver is None:
        return f"{what} needs an NVIDIA driver >= {need} (CUDA {cuda[0]}.{cuda[1]}); no driver found (nvidia-smi, {DRIVER_FILE})"
    if parse_version(driver) < min_driver(cuda):
        return (f"{what} is built for CUDA {cuda[0]}.{cuda[1]}, which needs an NVIDIA driver >= {need}; this node has "
                f"{driver}: ask for nodes with a newer driver, or lock that environment for an older CUDA")
    return ""


def require_cuda(gpus: int, job: str, env: dict | None = None) -> None:
    """Stop a job that asked for ``gpus`` GPUs (its ``gpu`` resource) and finds no usable CUDA,
    before it loads anything: the message names the driver, torch's CUDA build and the visible
    devices. A job that asked for none runs on the CPU."""
    if int(gpus or 0) <= 0:
        return
    # Asked through NVML: torch's own check (cudaGetDeviceCount) poisons fork without initialising
    # CUDA, so vLLM, built next in this process, would still fork its engine core and TP workers,
    # which then fail ("Cannot re-initialize CUDA in forked subprocess"). Read by torch at each call.
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return
    env = os.environ if env is None else env
    cuda = torch.version.cuda
    driver = driver_version()
    why = driver_problem(driver, tuple(int(p) for p in cuda.split(".")[:2]), f"torch {torch.__version__}") if cuda else ""
    raise NoCudaError(
        f"{job} asked for {gpus} GPU(s) and torch finds no usable CUDA device: torch {torch.__version__} "
        f"({'CUDA ' + cuda if cuda else 'a CPU-only build'}), NVIDIA driver {driver or 'not found'}, "
        f"CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '(unset)')}"
        + (f". {why}" if why else "")
        + ". The job stops rather than run on the CPU (python -m pwopsd.preflight --gpu-job checks a node first; "
          "a model entry with gpus 0 runs on the CPU on purpose)")


def require_job_cuda(snakemake) -> None:
    """:func:`require_cuda` for a rule's job (its ``gpu`` resource), unless the config's
    ``cluster.gpu_jobs_on_cpu`` says the run rehearses a cluster without GPUs (the test Slurm's
    GRES are device files, not GPUs)."""
    if (snakemake.config.get("cluster") or {}).get("gpu_jobs_on_cpu", False):
        return
    require_cuda(int(snakemake.resources.get("gpu", 0) or 0), f"rule {snakemake.rule}")


def rank_device(local_rank: int, env: dict | None = None) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` value for rank ``local_rank``'s own engine: its entry of the
    list the job inherited (Slurm's GPUs of this job, say ``4,5,6,7``), or its index when none is set."""
    env = os.environ if env is None else env
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if not visible:
        return str(local_rank)
    if local_rank >= len(visible):
        raise NoCudaError(f"rank {local_rank} has no GPU of its own: CUDA_VISIBLE_DEVICES={','.join(visible)} lists "
                          f"{len(visible)}; the job's gpu resource and its processes disagree")
    return visible[local_rank]
