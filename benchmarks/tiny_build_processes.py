"""Would the tiny build be faster on two processes of one thread each than on today's one process of
two threads? The build (800 pretraining steps) is alone on README command 1's critical path and
its two threads give about 1.3x one thread's speed (``docs/decisions.md``, "Tiny mode: where the
time goes"). Here each of two processes (``torchrun``, gloo) takes half the rows of each of a
step's length buckets (``pwopsd.tiny.model.pretraining_backward``), their gradients are summed by
one ``all_reduce`` and both take the same AdamW step. Every mode runs tiny mode's pins (exact
products, the AVX2 kernel path) on the committed recipe's steps; the ranks' weights are checked
equal at the end. Seconds a step, minimum of interleaved repeats, as ratios to one process of two
threads.

Bits: the split's gradient is another float32 sum than one process's, so its build is another
build (a new digest, and the five-build table of ``docs/tiny_robustness.md`` again); its bits no
longer depend on the host's core count, only on the number of processes.

    python benchmarks/tiny_build_processes.py            # --repeats 5 --steps 10
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODES = {"1 process, 2 threads (the build today)": (1, 2), "1 process, 1 thread": (1, 1),
         "2 processes, 1 thread each": (2, 1)}


def worker(steps: int, warmup: int, threads: int) -> None:
    """Pretraining steps of the committed recipe in this process (a rank when run by torchrun);
    prints one JSON line: seconds a step after ``warmup`` steps, the weights' hash, the rank."""
    sys.path.insert(0, str(REPO / "src"))
    from pwopsd.config import load_config
    from pwopsd.runtime import pin_kernel_path, pin_matmul

    config = load_config(REPO / "tiny" / "config" / "config.yaml")
    pin_matmul(config["cpu_matmul"])
    pin_kernel_path(config["cpu_kernel_path"])
    import numpy as np
    import torch
    import torch.distributed as dist

    from pwopsd import settings
    from pwopsd.runtime import set_threads
    from pwopsd.tiny import examples as E
    from pwopsd.tiny import model as M

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = 0
    if world > 1:
        dist.init_process_group("gloo")
        rank = dist.get_rank()
    set_threads(threads)
    cfg = E.TinyBuildConfig.from_dict(settings.tiny_model(config, types.SimpleNamespace(model="tiny_qwen3")))
    tokenizer = E.tiny_tokenizer(cfg)
    model = M.build_model(cfg, tokenizer)
    model.train()
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    opt = M.pretraining_optimizer(model, cfg)
    params = list(model.parameters())
    t0 = 0.0
    for step in range(warmup + steps):
        if step == warmup:
            if world > 1:
                dist.barrier()
            t0 = time.perf_counter()
        batch = [E.sample_pretraining_example(rng, cfg) for _ in range(cfg.batch_size)]
        for group in opt.param_groups:
            group["lr"] = M.lr_at(step, cfg)
        opt.zero_grad(set_to_none=True)
        M.pretraining_backward(model, tokenizer, batch, cfg, rows=slice(rank, None, world))
        if world > 1:
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
            dist.all_reduce(flat)
            for p, g in zip(params, flat.split([p.numel() for p in params])):
                p.grad = g.view_as(p).clone()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
    seconds = (time.perf_counter() - t0) / steps
    print(json.dumps({"rank": rank, "seconds": seconds, "hash": M.weights_fingerprint(model), "threads": torch.get_num_threads()}),
          flush=True)
    if world > 1:
        dist.destroy_process_group()


def measure(processes: int, threads: int, steps: int, warmup: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", str(steps), str(warmup), str(threads)]
    if processes > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}", *cmd[1:]]
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    ranks = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if len(ranks) != processes or len({r["hash"] for r in ranks}) != 1 or {r["threads"] for r in ranks} != {threads}:
        raise SystemExit(f"the ranks disagree or ran otherwise than asked: {ranks}")
    return {"seconds": max(r["seconds"] for r in ranks), "hash": ranks[0]["hash"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--worker", nargs=3, type=int, metavar=("STEPS", "WARMUP", "THREADS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(*args.worker)
        return 0
    best: dict[str, float] = {}
    hashes: dict[str, str] = {}
    for _ in range(args.repeats):  # interleaved: each repeat runs every mode once
        for name, (processes, threads) in MODES.items():
            got = measure(processes, threads, args.steps, args.warmup)
            best[name] = min(best.get(name, float("inf")), got["seconds"])
            hashes[name] = got["hash"]
    base = best[next(iter(MODES))]
    print(f"{args.steps} pretraining steps after {args.warmup}, minimum of {args.repeats} interleaved repeats "
          f"(batch of 32, exact products, kernel path avx2):")
    print("| mode | s a step | against the build today | weights after the steps |")
    print("|---|---|---|---|")
    for name in MODES:
        print(f"| {name} | {best[name]:.3f} | {best[name] / base:.2f}x | {hashes[name]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
