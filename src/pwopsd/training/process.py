"""This process's place in a training run: its rank and world size, its RNG states (saved and
restored per rank on resume) and the switches that make GPU kernels deterministic."""

from __future__ import annotations

import logging
import os
import random

import numpy as np
import torch

log = logging.getLogger(__name__)


def dist_info() -> tuple[int, int]:
    """(rank, world size) of the torch.distributed group, (0, 1) without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


# cuBLAS's deterministic workspace setting (NVIDIA's cuBLAS docs, "Results reproducibility"):
# ":4096:8" costs about 24 MiB of GPU memory per process, ":16:8" may limit performance. Either is
# deterministic; one already set in the environment is kept.
CUBLAS_WORKSPACE_CONFIG = ":4096:8"
_CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")


def set_determinism(deterministic: bool) -> None:
    """``training.deterministic``: with ``True``, PyTorch's deterministic algorithms (an operation
    that has none raises), cuBLAS's deterministic workspace (``CUBLAS_WORKSPACE_CONFIG``) and no cuDNN
    benchmarking. With ``False`` nothing is changed (PyTorch's defaults: fastest kernels, some of them
    nondeterministic on GPU; on CPU the training path is deterministic either way).

    cuBLAS reads its workspace setting when it creates a handle (a process's first GPU matrix
    product), so this must run before any CUDA work: in the train job first thing in
    :func:`pwopsd.training.job.run`, before the process group (NCCL), the model and a rollout engine
    touch the GPU. The Trainer calls it too (the model is on its device by then: in time for the
    switches, late for the environment variable, a warning says so when CUDA is initialised
    without it)."""
    if not deterministic:
        return
    if os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in _CUBLAS_DETERMINISTIC:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            log.warning("training.deterministic: CUDA was initialised before CUBLAS_WORKSPACE_CONFIG was set; "
                        "matrix products of cuBLAS handles made before may not be deterministic "
                        "(call pwopsd.training.process.set_determinism before any CUDA work)")
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE_CONFIG
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True  # implied by the above for convolutions; stated for clarity


def rank_rng_state(device: torch.device | None = None) -> dict:
    """This process's RNG states: CPU torch, numpy, Python, and with a CUDA ``device`` (the model's)
    that device's CUDA generator, the one its LoRA dropout draws from. Only the model's device: the
    other devices of the node are other ranks' (restoring all of them from every process would
    open a CUDA context on each device from each rank)."""
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rank_rng_state(state: dict, device: torch.device | None = None) -> None:
    """Restore :func:`rank_rng_state`; its CUDA generator state goes to ``device`` (the model's), the
    generator this rank's dropout draws from on resume."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    on_cuda = device is not None and device.type == "cuda"
    if "cuda" in state and on_cuda:
        torch.cuda.set_rng_state(state["cuda"], device)
    elif "cuda" in state:
        log.warning("the checkpoint holds a CUDA RNG state but this run trains on %s: it is not restored "
                    "(dropout draws from the CPU generator here)", device or "cpu")
    elif on_cuda:
        log.warning("the checkpoint holds no CUDA RNG state (written on CPU or by an older version): the CUDA "
                    "generator keeps its seed, so LoRA dropout masks after this resume differ from an "
                    "uninterrupted run's")
