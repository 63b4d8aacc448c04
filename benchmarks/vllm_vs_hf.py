"""Generation throughput of the `vllm` backend against the `hf` backend, on the same requests.

Both backends are built once (the vLLM engine's start is reported apart), then each workload runs
on one backend and the other in turn, `--repeats` times (interleaved: these machines are shared,
and a single timing can be off by 3x); the table reports each backend's best (minimum) time as
tokens/s and the ratio vLLM / hf. Workloads:

- greedy: one sample per prompt, temperature 0 (both engines generate the same tokens);
- evaluation shape: `--n` seeded samples per prompt at T=1.0, top-p 0.95 (the paper's sampling).

Runs where vLLM is importable: on CPU the CPU vLLM environment (``python tools/stacks.py
vllm-cpu-env``)::

    .venv-vllm-cpu/bin/python benchmarks/vllm_vs_hf.py --model tiny/results/models/tiny_qwen3/base

On CPU with the 0.85M-parameter tiny model vLLM is not expected to win (its per-step scheduling
costs more than such a model's forward). On a GPU, at the paper's shape (a Qwen3-4B-architecture
model, e.g. random weights from its config, bf16, AIME-length budgets)::

    python benchmarks/vllm_vs_hf.py --model /path/to/qwen3-4b --device cuda --dtype bfloat16 \\
        --prompts 60 --n 12 --new-tokens 4096 --max-model-len 8192 --batch 64
"""

from __future__ import annotations

import argparse
import os
import time


def requests(tok, n_prompts: int, n: int, new_tokens: int, greedy: bool):
    from pwopsd.generation import GenerationRequest
    from pwopsd.generation.sampling import eval_prompt_ids

    problems = [f"Compute {i % 30 + 1} + {i % 7 + 2} - {i % 11 + 1}." for i in range(n_prompts)]
    ids = eval_prompt_ids(tok, problems, enable_thinking=True, add_special_tokens=False)
    if greedy:
        return [GenerationRequest(tuple(p), temperature=0.0, max_new_tokens=new_tokens) for p in ids]
    return [GenerationRequest(tuple(p), n=n, seed=i, temperature=1.0, top_p=0.95, max_new_tokens=new_tokens)
            for i, p in enumerate(ids)]


def timed(backend, reqs) -> tuple[float, int]:
    t0 = time.perf_counter()
    out = backend.generate(reqs)
    return time.perf_counter() - t0, sum(len(c.token_ids) for comps in out for c in comps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a checkpoint folder (config, weights, tokenizer)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=4, help="samples per prompt in the evaluation-shape workload")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--max-model-len", type=int, default=512, help="engine context (the tiny model's is 512)")
    ap.add_argument("--batch", type=int, default=256, help="hf backend batch size (rows)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--kv-cache-gib", type=float, default=1.0, help="vLLM KV cache on CPU (ignored on cuda)")
    ap.add_argument("--in-process", action="store_true", help="vLLM engine core and worker in this process")
    args = ap.parse_args()
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""

    from pwopsd.generation.sampling import make_backend
    from pwopsd.models import load_tokenizer

    manifest = {"path": os.path.abspath(args.model)}
    tok = load_tokenizer(manifest)
    options = {"hf_batch_size": args.batch, "in_process": args.in_process}
    if args.device == "cpu":
        options.update(kv_cache_memory_gib=args.kv_cache_gib, enable_chunked_prefill=False)
    hf = make_backend("hf", manifest, dtype=args.dtype, max_model_len=args.max_model_len, tokenizer=tok,
                      options=options, progress=False)
    vllm = make_backend("vllm", manifest, dtype=args.dtype, max_model_len=args.max_model_len, options=options)
    workloads = {"greedy": requests(tok, args.prompts, 1, args.new_tokens, greedy=True),
                 f"n={args.n}, T=1.0, top-p 0.95": requests(tok, args.prompts, args.n, args.new_tokens, greedy=False)}
    t0 = time.perf_counter()
    timed(vllm, workloads["greedy"][:2])
    start = time.perf_counter() - t0
    timed(hf, workloads["greedy"][:2])  # warm-up
    best: dict[tuple[str, str], tuple[float, int]] = {}
    for _ in range(args.repeats):
        for name, reqs in workloads.items():
            for label, backend in (("vllm", vllm), ("hf", hf)):
                seconds, tokens = timed(backend, reqs)
                if (label, name) not in best or seconds < best[(label, name)][0]:
                    best[(label, name)] = (seconds, tokens)
    vllm.close()
    print(f"vLLM engine start (first call, incl. engine processes): {start:.1f} s; "
          f"{args.prompts} prompts, <= {args.new_tokens} new tokens, {args.device}, {args.dtype}, "
          f"best of {args.repeats} interleaved repeats")
    print(f"{'workload':<28}{'hf tok/s':>10}{'vllm tok/s':>12}{'vllm / hf':>11}")
    for name in workloads:
        rate = {b: best[(b, name)][1] / best[(b, name)][0] for b in ("hf", "vllm")}
        print(f"{name:<28}{rate['hf']:>10.0f}{rate['vllm']:>12.0f}{rate['vllm'] / rate['hf']:>10.2f}x")


if __name__ == "__main__":
    main()
