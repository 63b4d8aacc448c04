"""Two costs of tiny mode's generation with exact products, each against its predecessor measured
in the same run (interleaved, minimum of ``--repeats``, at least 5: a single timing on these shared
machines can be off by 3x).

1. ``rollouts``: one training step's rollouts (32 prompts, one sample each, up to 64 tokens, top-k 20)
   from the tiny model wrapped in LoRA, with :func:`pwopsd.exact_matmul.reuse_weights` (each weight
   rounded once a call) against without it (once a token). The tokens must be the same.
2. ``generate job``: one generate job's samples (the four tiny benchmarks x 3 seeds x 12 samples)
   in groups of at most 100 problems (:func:`pwopsd.generation.sampling.run_shards`, as the job runs
   them now) against one backend call per (seed, benchmark) (the job before).

    python benchmarks/tiny_exact_generation.py --model tiny/results/models/tiny_qwen3/base \\
        --benchmarks tiny/results/data/benchmarks [--repeats 5]
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny/results/models/tiny_qwen3/base")
    ap.add_argument("--benchmarks", default="tiny/results/data/benchmarks")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if args.repeats < 5:
        ap.error("--repeats: at least 5")

    import os

    os.environ["PWOPSD_CPU_MATMUL"] = "exact"
    from pwopsd.runtime import set_threads

    set_threads(1)  # as a tiny generate or train job
    import pandas as pd
    from peft import LoraConfig, get_peft_model

    from pwopsd import exact_matmul
    from pwopsd.generation import GenerationRequest
    from pwopsd.generation import hf_backend
    from pwopsd.generation.sampling import eval_prompt_ids
    from pwopsd.models import load_model, load_tokenizer

    manifest = {"path": args.model}
    tok = load_tokenizer(manifest)
    model = load_model(manifest, device="cpu", dtype="float32")

    # 1. rollouts, with and without the weight roundings reused
    lora = get_peft_model(load_model(manifest, device="cpu", dtype="float32"),
                          LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                                         "gate_proj", "up_proj", "down_proj"]))
    ids = eval_prompt_ids(tok, [f"Compute {i % 9 + 1} + {i % 7}." for i in range(32)], enable_thinking=True,
                          add_special_tokens=False)
    rollouts = [GenerationRequest(tuple(p), n=1, seed=i, temperature=1.0, top_p=0.95, top_k=20, max_new_tokens=64)
                for i, p in enumerate(ids)]
    backend = hf_backend.HFBackend(lora, tok, batch_size=64)
    reuse = exact_matmul.reuse_weights
    times = {"reused": [], "rounded a token": []}
    tokens = {}
    for _ in range(args.repeats):
        for name, context in (("reused", reuse), ("rounded a token", contextlib.nullcontext)):
            exact_matmul.reuse_weights = context  # what HFBackend.generate enters
            t0 = time.perf_counter()
            out = backend.generate(rollouts)
            times[name].append(time.perf_counter() - t0)
            tokens[name] = [o[0].token_ids for o in out]
    exact_matmul.reuse_weights = reuse
    if tokens["reused"] != tokens["rounded a token"]:
        raise SystemExit("the rollouts differ with the weight roundings reused")
    base = min(times["rounded a token"])
    print("rollouts (32 prompts x 1 sample <= 64 tokens, LoRA):")
    for name, ts in times.items():
        print(f"  {name:<28} {min(ts):7.3f} s  {min(ts) / base:5.2f}x")

    # 2. one generate job's samples: grouped against one call per (seed, benchmark)
    requests = []  # [(seed, benchmark) -> requests]
    for seed in (None, 1, 2):
        for path in sorted(Path(args.benchmarks).glob("*.parquet")):
            table = pd.read_parquet(path)
            prompts = eval_prompt_ids(tok, list(table["problem"]), enable_thinking=True, add_special_tokens=False)
            requests.append([GenerationRequest(tuple(p), n=12, seed=seed, temperature=1.0, top_p=0.95, top_k=-1,
                                               max_new_tokens=96) for p in prompts])
    backend = hf_backend.HFBackend(model, tok, batch_size=1200)

    def apart():
        for reqs in requests:
            backend.generate(reqs)

    def grouped():  # run_shards' groups: consecutive (seed, benchmark) shards up to 100 problems
        group = []
        for reqs in requests:
            if group and len(group) + len(reqs) > 100:
                backend.generate(group)
                group = []
            group = group + reqs
        backend.generate(group)

    times = {"grouped": [], "one call a benchmark": []}
    for _ in range(args.repeats):
        for name, fn in (("grouped", grouped), ("one call a benchmark", apart)):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    base = min(times["one call a benchmark"])
    print(f"generate job ({sum(len(r) for r in requests)} problems x 12 samples <= 96 tokens):")
    for name, ts in times.items():
        print(f"  {name:<28} {min(ts):7.3f} s  {min(ts) / base:5.2f}x")


if __name__ == "__main__":
    main()
