"""Evaluation sampling with the samples of a prompt sharing its prefill, against one prefill a sample.

The tiny run's generate job samples n = 12 completions of every problem. The `hf` backend runs the
prompt once and repeats its KV cache for the 12 rows (``share_prefill=True``, the default); before,
every row ran the prompt itself (``share_prefill=False``). Both give the same tokens (checked here
on every run). Timed interleaved ``--repeats`` times (at least 5) on one thread; the minimum of
each is kept, since this machine is shared and a single timing can be off by 3x.

    python benchmarks/shared_prefill.py [--model tiny/results/models/tiny_qwen3/base] [--problems 60]

Without --model a freshly initialized tiny-architecture model is used (same shapes; its samples
run to the token limit, so the decode share is larger than a trained model's).
"""

from __future__ import annotations

import argparse
import time

import torch

from pwopsd.generation import GenerationRequest
from pwopsd.generation.hf_backend import HFBackend

from generation_throughput import load, prompt_ids


def sample(backend: HFBackend, requests) -> tuple[float, list]:
    t0 = time.perf_counter()
    out = backend.generate(requests)
    return time.perf_counter() - t0, [[c.token_ids for c in row] for row in out]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--problems", type=int, default=60)
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if args.repeats < 5:
        ap.error("--repeats must be at least 5")
    torch.set_num_threads(1)
    model, tok = load(args.model)
    requests = [GenerationRequest(p, n=args.n, seed=i, temperature=1.0, top_p=0.95, top_k=0, max_new_tokens=args.max_new_tokens)
                for i, p in enumerate(prompt_ids(tok, args.problems))]
    backends = {"one prefill a sample": HFBackend(model, tok, batch_size=args.batch, share_prefill=False),
                "shared prefill": HFBackend(model, tok, batch_size=args.batch)}
    best = {name: float("inf") for name in backends}
    tokens = {}
    for _ in range(args.repeats):
        for name, backend in backends.items():
            seconds, tokens[name] = sample(backend, requests)
            best[name] = min(best[name], seconds)
    assert tokens["shared prefill"] == tokens["one prefill a sample"], "the shared prefill changed the samples"
    base = best["one prefill a sample"]
    print(f"{args.problems} problems x {args.n} samples, batch {args.batch}, 1 thread, min of {args.repeats}:")
    for name, seconds in best.items():
        print(f"  {name:<22}{seconds:7.2f} s   {seconds / base:5.2f}x")


if __name__ == "__main__":
    main()
