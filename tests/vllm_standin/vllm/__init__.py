"""A recording stand-in for the ``vllm`` package, for engine-lifecycle tests on CPU only.

vLLM cannot run on the CPU test machines, so ``tests/test_vllm_backend.py`` puts this directory
first on the import path to count engine constructions (one line per ``LLM(...)`` in the file
named by ``PWOPSD_VLLM_STANDIN_LOG``, also from spawned data-parallel processes). It covers only
what the backend calls; that those calls fit the real release is checked against the pinned vLLM
wheel by ``tests/test_vllm_contract.py``.

Each ``generate`` call is logged too (``{"generate": <number of prompts>}``). Completions are a
deterministic function of (prompt ids, seed, sample index), so results can be compared across
data-parallel layouts. With ``PWOPSD_VLLM_STANDIN_FAIL_AT_CALL=k`` the k-th ``generate`` call of
an engine raises, to simulate a job that dies part-way.
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass

__version__ = "0.0.0+standin"


class SamplingParams:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list
    finish_reason: str


@dataclass
class RequestOutput:
    outputs: list


class LLM:
    def __init__(self, model: str, **kwargs):
        self.model = model
        self.kwargs = kwargs
        self.calls = 0
        self.fail_at = int(os.environ.get("PWOPSD_VLLM_STANDIN_FAIL_AT_CALL", "0"))
        _record({"pid": os.getpid(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "model": model,
                 **kwargs})

    def generate(self, prompts, sampling_params, *, use_tqdm=True):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("stand-in engine: simulated failure")
        _record({"generate": len(prompts), "pid": os.getpid()})
        outputs = []
        for prompt, params in zip(prompts, sampling_params):
            ids = list(prompt["prompt_token_ids"])
            kw = params.kwargs
            seed = kw.get("seed", self.kwargs.get("seed", 0))
            samples = []
            for j in range(kw["n"]):
                h = zlib.crc32(json.dumps([ids, seed, j]).encode())
                tokens = [h % 97, (h // 97) % 97, (h // 9409) % 97][: kw["max_tokens"]]
                samples.append(CompletionOutput(index=j, text=" ".join(map(str, tokens)), token_ids=tokens,
                                                finish_reason="length"))
            outputs.append(RequestOutput(outputs=samples[::-1]))  # vLLM does not promise index order
        return outputs


def _record(entry: dict) -> None:
    log = os.environ.get("PWOPSD_VLLM_STANDIN_LOG")
    if log:
        with open(log, "a") as fh:
            fh.write(json.dumps(entry) + "\n")
