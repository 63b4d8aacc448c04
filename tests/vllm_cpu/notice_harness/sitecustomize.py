"""Test harness of ``tests/vllm_cpu/test_vllm_notice.py``: Slurm's notice, sent at a chosen point.

A process started with this folder on ``PYTHONPATH`` and ``PWOPSD_TEST_NOTICE=<point>:<step>``
(rank 0 only, where torchrun starts several) sends SIGTERM to every process of the job (the process
``PWOPSD_TEST_JOB_ROOT`` and all its descendants: the launcher, torchrun, every rank, every vLLM
engine process), as Slurm signals every process of a job step, once, when the training's rollout
engine reaches ``<point>`` of step ``<step>``:

- ``sync``: inside the weight sync, after the new policy is written and before the engine loads it;
- ``rollouts``: as the engine starts the step's rollouts.

Nothing of the training, the engine or the signal path is replaced; the rollout engine's two
methods are wrapped to send the signal at that moment.
"""

import importlib.abc
import importlib.util
import os
import signal
import sys

_SPEC = os.environ.get("PWOPSD_TEST_NOTICE")


def _notice_every_process() -> None:
    import psutil

    root = psutil.Process(int(os.environ["PWOPSD_TEST_JOB_ROOT"]))
    for proc in [root, *root.children(recursive=True)]:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    with open(os.environ["PWOPSD_TEST_NOTICE_SENT"], "w") as fh:
        fh.write(f"{_SPEC} {len(root.children(recursive=True)) + 1} processes\n")


def _patch(module) -> None:
    point, step = _SPEC.split(":")
    step = int(step)
    cls = module.VLLMRollouts
    sync, generate = cls.sync, cls.generate
    state = {"step": None, "sent": False}

    def patched_sync(self, peft_model, at):
        state["step"] = at + 1  # the step whose rollouts this sync serves
        seconds = sync(self, peft_model, at)
        if point == "sync" and state["step"] == step and not state["sent"]:
            state["sent"] = True
            _notice_every_process()
        return seconds

    def patched_generate(self, requests):
        if point == "rollouts" and state["step"] == step and not state["sent"]:
            state["sent"] = True
            _notice_every_process()
        return generate(self, requests)

    cls.sync, cls.generate = patched_sync, patched_generate


class _AfterImport(importlib.abc.MetaPathFinder):
    """Wraps the rollout engine's methods once ``pwopsd.generation.rollout`` is imported."""

    name = "pwopsd.generation.rollout"

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch(module)

        loader.exec_module = exec_and_patch
        return spec


if _SPEC and os.environ.get("RANK", "0") == "0":
    sys.meta_path.insert(0, _AfterImport())
