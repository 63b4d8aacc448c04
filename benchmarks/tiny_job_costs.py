"""Two per-job costs of the tiny run, each against its predecessor measured in the same run.

1. ``merge``: a merge job's process, start to end, with ``pwopsd.training.merge`` (safetensors to
   safetensors) against PEFT's ``merge_and_unload`` + ``save_pretrained`` on a model loaded with
   transformers (what the rule ran before), on the same base and adapter. Each is a fresh Python
   process, as a Snakemake job is, so the imports count.
2. ``sampler``: ``filter_and_sample`` on a batch of next-token logits of the tiny model (top-p 0.95,
   no top-k), sorting only a 64-token window against sorting the whole vocabulary (``window`` = the
   vocabulary size: the previous sampler's work).

Each pair is timed interleaved, ``--repeats`` times (at least 5), and the minimum of each is kept:
this machine is shared and a single timing can be off by 3x. Prints seconds and the ratio.

    python benchmarks/tiny_job_costs.py --model tiny/results/models/tiny_qwen3/base \\
        --adapter tiny/results/training/tiny_qwen3/opsd/adapter [--repeats 5]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OURS = """
from pwopsd.training.merge import merge_lora_checkpoint
merge_lora_checkpoint({base!r}, {adapter!r}, {out!r}, "float32")
"""
PEFT = """
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained({base!r}, dtype="float32")
merged = PeftModel.from_pretrained(model, {adapter!r}).merge_and_unload()
merged.save_pretrained({out!r}, safe_serialization=True)
AutoTokenizer.from_pretrained({base!r}).save_pretrained({out!r})
"""


def time_process(code: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return time.perf_counter() - t0


def merge_times(base: Path, adapter: Path, repeats: int) -> dict[str, float]:
    best = {"pwopsd.training.merge": float("inf"), "PEFT merge_and_unload": float("inf")}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            for name, code in (("pwopsd.training.merge", OURS), ("PEFT merge_and_unload", PEFT)):
                out = Path(tmp) / f"{name[:4]}-{i}"
                best[name] = min(best[name], time_process(code.format(base=str(base), adapter=str(adapter), out=str(out))))
    return best


def sampler_times(base: Path, repeats: int, rows: int = 256, calls: int = 50) -> dict[str, float]:
    import torch

    from pwopsd import prompts
    from pwopsd.generation.hf_backend import filter_and_sample
    from pwopsd.models import load_model, load_tokenizer
    from pwopsd.tiny.arithmetic import sample_problems

    torch.set_num_threads(1)
    manifest = {"path": str(base)}
    model, tok = load_model(manifest), load_tokenizer(manifest)
    texts = [prompts.render(tok, prompts.eval_message(p.problem), prompts.EVAL) for p in sample_problems(5, rows, [1, 2, 3], 9)]
    batch = tok(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(**batch).logits[:, -1, :].float()
    t = torch.ones(rows)
    p = torch.full((rows,), 0.95)
    k = torch.zeros(rows, dtype=torch.long)
    u = torch.rand(rows, generator=torch.Generator().manual_seed(0))
    best = {"window of 64": float("inf"), "whole vocabulary": float("inf")}
    for _ in range(repeats):
        for name, window in (("window of 64", 64), ("whole vocabulary", logits.shape[-1])):
            t0 = time.perf_counter()
            for _ in range(calls):
                out = filter_and_sample(logits, t, p, k, u, window=window)
            best[name] = min(best[name], (time.perf_counter() - t0) / calls)
    assert torch.equal(filter_and_sample(logits, t, p, k, u, window=64), out)  # the same tokens
    return best


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="a tiny base checkpoint folder")
    ap.add_argument("--adapter", type=Path, required=True, help="a trained adapter folder of that model")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    repeats = max(5, args.repeats)
    for title, best, unit in (("merge job (fresh process, imports included)", merge_times(args.model, args.adapter, repeats), "s"),
                              ("sampler, one call on 256 rows", sampler_times(args.model, repeats), "ms")):
        (new, a), (old, b) = best.items()
        scale = 1000.0 if unit == "ms" else 1.0
        print(f"{title}: {new} {a * scale:.2f} {unit}, {old} {b * scale:.2f} {unit}, ratio {a / b:.2f} "
              f"(min of {repeats} interleaved repeats)")


if __name__ == "__main__":
    main()
