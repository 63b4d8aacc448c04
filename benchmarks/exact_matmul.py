"""What tiny mode's exact CPU matrix products (``cpu_matmul: exact``, ``pwopsd.exact_matmul``) cost
against torch's own (MKL ``sgemm``), at the tiny model's shapes: a decoding step's products (a
batch of rows), a training step's (a batch of sequences, forward and backward), and the whole of a
pretraining step of the tiny model; the exact products with their rounding by torch's operations and
by the compiled kernel (``pwopsd.exact_kernel``, the same bits). Ratios to native from the minimum
of interleaved repeats.

    python benchmarks/exact_matmul.py            # --repeats 5 --threads 1
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pwopsd import exact_kernel as K  # noqa: E402
from pwopsd import exact_matmul as X  # noqa: E402

MODES = ("native", "exact, torch rounding", "exact, compiled rounding")


def use(mode: str) -> None:
    if mode == "native":
        X.uninstall()
        return
    os.environ[K.ENV] = "c" if "compiled" in mode else "torch"
    K._state.clear()
    X.install()

# (rows M, inner K, columns N) of the tiny model's products: hidden 128, MLP 384, vocabulary 502.
SHAPES = {
    "decode q/o 512x128x128": (512, 128, 128),
    "decode mlp 512x128x384": (512, 128, 384),
    "decode head 512x128x502": (512, 128, 502),
    "train mlp 2560x128x384": (2560, 128, 384),
    "train down 2560x384x128": (2560, 384, 128),
    "train grad W 128x2560x384": (128, 2560, 384),
}


def timed(fn, number: int) -> float:
    t = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t) / number


def pretraining_step():
    """One tiny pretraining step (forward, backward, AdamW) as the build runs it."""
    from pwopsd import settings
    from pwopsd.config import load_config
    from pwopsd.tiny import examples as E
    from pwopsd.tiny import model as M

    cfg = E.TinyBuildConfig.from_dict(settings.tiny_model(load_config("tiny/config/config.yaml"), types.SimpleNamespace(model="tiny_qwen3")))
    object.__setattr__(cfg, "max_steps", 3)
    M.is_check_step = lambda done, cfg: False
    tok = E.tiny_tokenizer(cfg, corpus_size=300)

    def step():
        torch.manual_seed(0)
        M.pretrain(M.build_model(cfg, tok), tok, cfg, log_every=10**9)
    return step


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (tiny mode's jobs use 1, the build 2)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    cases = {name: (lambda a, b: (lambda: a @ b))(torch.randn(m, k, generator=g), torch.randn(k, n, generator=g))
             for name, (m, k, n) in SHAPES.items()}
    cases["pretraining: 3 steps of the tiny model"] = pretraining_step()
    best = {(name, mode): float("inf") for name in cases for mode in MODES}
    for _ in range(args.repeats):  # interleaved: every mode side by side in every repeat
        for name, fn in cases.items():
            number = 1 if name.startswith("pretraining") else 20
            for mode in MODES:
                use(mode)
                best[name, mode] = min(best[name, mode], timed(fn, number))
    X.uninstall()
    print(f"exact vs native CPU matrix products, {args.threads} thread(s), min of {args.repeats} interleaved repeats")
    print(f"{'case':42s} {'native':>10s} {'exact, torch':>13s} {'exact, compiled':>16s} {'compiled / torch':>17s}")
    for name in cases:
        n, t, c = (best[name, m] for m in MODES)
        print(f"{name:42s} {n * 1e3:7.2f} ms {t / n:12.2f}x {c / n:15.2f}x {c / t:16.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
