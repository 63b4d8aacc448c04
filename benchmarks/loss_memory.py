"""Peak memory and time of the reference loss path vs the chunked path, measured in one run.

Reference path: logits = h @ W^T materialized for student and teacher ([B, T, V]), then the loss of
`pwopsd.training.losses`, then backward to the student hidden states. Chunked path: `pwopsd.training.chunked`
(the same value and gradient). Each measurement runs in a fresh process; on CPU the figure is the
peak RSS growth over the inputs, on CUDA `torch.cuda.max_memory_allocated` over the inputs.

    python benchmarks/loss_memory.py                       # CPU, reduced shape
    python benchmarks/loss_memory.py --device cuda --dtype bfloat16 --hidden 2560 --vocab 151936 --batch 4 --seq 1024 --chunk 128
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def measure(args) -> dict:
    import resource

    import torch

    from pwopsd.training import chunked as C
    from pwopsd.training import losses as L
    from pwopsd.training.registry import loss_keywords

    torch.manual_seed(0)
    dev = torch.device(args.device)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    B, T, H, V = args.batch, args.seq, args.hidden, args.vocab
    h_s = (torch.randn(B, T, H, device=dev, dtype=dtype) * 0.5).requires_grad_(True)
    h_t = torch.randn(B, T, H, device=dev, dtype=dtype) * 0.5
    W = torch.randn(V, H, device=dev, dtype=dtype) / H**0.5
    mask = torch.ones(B, T, device=dev)
    mask[:, T - T // 8 :] = 0  # some padding
    tokens = torch.randint(0, V, (B, T), device=dev)

    kw = loss_keywords(args.method)  # the paper's settings (PW-OPSD: Moderate), from the config schema

    def run(h_s=h_s, h_t=h_t, W=W, mask=mask, tokens=tokens):
        if args.method == "pwopsd":
            if args.path == "reference":
                loss = L.pwopsd_loss(h_s @ W.T, h_t @ W.T, mask, **kw)
            else:
                loss = C.pwopsd_loss_chunked(h_s, h_t, W, mask, chunk_size=args.chunk, **kw)
        else:
            if args.path == "reference":
                loss = L.eopd_loss(h_s @ W.T, h_t @ W.T, tokens, mask, **kw)
            else:
                loss = C.eopd_loss_chunked(h_s, h_t, W, tokens, mask, chunk_size=args.chunk, **kw)
        loss.backward()
        h_s.grad = None
        return float(loss)

    # Warm-up on a tiny input of the same path: one-off costs (kernels, library pages) stay out of
    # the figure.
    tiny = [x[:1, :16].detach().clone().requires_grad_(x.requires_grad) for x in (h_s, h_t)]
    run(h_s=tiny[0], h_t=tiny[1], mask=mask[:1, :16], tokens=tokens[:1, :16])
    if dev.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    value = run()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    first = time.perf_counter() - t0
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        run()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return {"peak_bytes": int(peak), "seconds": min(times) if times else first, "value": value}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--chunk", type=int, default=32, help="tokens per chunk (about 1/32 of B*T keeps memory under 1/8)")
    ap.add_argument("--method", default="pwopsd", choices=["pwopsd", "eopd"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--path", choices=["reference", "chunked"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.path:  # child process: one measurement
        print(json.dumps(measure(args)))
        return
    res = {}
    for path in ("reference", "chunked"):
        cmd = [sys.executable, __file__, *sys.argv[1:], "--path", path]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        res[path] = json.loads(out)
    r, c = res["reference"], res["chunked"]
    print(f"shape B={args.batch} T={args.seq} H={args.hidden} V={args.vocab} {args.dtype} on {args.device}, "
          f"method {args.method}, chunk {args.chunk} tokens")
    for name, m in res.items():
        print(f"  {name:<9} peak {m['peak_bytes'] / 2**20:9.1f} MiB   time {m['seconds'] * 1000:8.1f} ms   loss {m['value']:.6f}")
    print(f"memory ratio chunked/reference: {c['peak_bytes'] / max(r['peak_bytes'], 1):.3f} (target <= 0.125)")
    print(f"time ratio chunked/reference:   {c['seconds'] / r['seconds']:.3f} (target <= 1.1)")


if __name__ == "__main__":
    main()
