"""Generation throughput of the `hf` backend, measured against transformers' own `generate`.

Prints tokens/s for the backend at batch 1 and batched, and for `model.generate` (sampling,
same settings, same batches) measured in the same run, with the ratios between them. EOS is
disabled so that every row generates exactly `--new-tokens` tokens.

    python benchmarks/generation_throughput.py [--model tiny/results/models/tiny_qwen3/base]

Without --model a freshly initialized tiny-architecture model is used (same shapes).
"""

from __future__ import annotations

import argparse
import time

import torch

from pwopsd import prompts
from pwopsd.generation import GenerationRequest
from pwopsd.generation.hf_backend import HFBackend


def load(model_dir: str | None):
    if model_dir:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        return AutoModelForCausalLM.from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir)
    from pwopsd.tiny.examples import TinyBuildConfig, tiny_tokenizer
    from pwopsd.tiny.model import build_model

    cfg = TinyBuildConfig()
    tok = tiny_tokenizer(cfg, corpus_size=600)
    return build_model(cfg, tok).eval(), tok


def prompt_ids(tok, n: int) -> list[tuple[int, ...]]:
    out = []
    for i in range(n):
        text = prompts.render(tok, prompts.eval_message(f"Compute {i % 30 + 1} + {i % 7 + 2} - {i % 11 + 1}."), prompts.EVAL)
        out.append(tuple(prompts.encode(tok, text, add_special_tokens=False)))
    return out


def ours(model, tok, ids, batch: int, new_tokens: int) -> float:
    backend = HFBackend(model, tok, batch_size=batch, eos_ids=[])
    reqs = [GenerationRequest(p, n=1, seed=i, temperature=1.0, top_p=0.95, top_k=0, max_new_tokens=new_tokens) for i, p in enumerate(ids)]
    t0 = time.perf_counter()
    backend.generate(reqs)
    return len(ids) * new_tokens / (time.perf_counter() - t0)


@torch.inference_mode()
def reference(model, tok, ids, batch: int, new_tokens: int) -> float:
    t0 = time.perf_counter()
    for s in range(0, len(ids), batch):
        chunk = ids[s : s + batch]
        width = max(map(len, chunk))
        x = torch.tensor([[tok.pad_token_id] * (width - len(p)) + list(p) for p in chunk])
        attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        model.generate(x, attention_mask=attn, do_sample=True, temperature=1.0, top_p=0.95, top_k=0,
                       max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=tok.pad_token_id)
    return len(ids) * new_tokens / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompts", type=int, default=128)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load(args.model)
    ids = prompt_ids(tok, args.prompts)
    few = ids[: max(8, args.prompts // 16)]
    ours(model, tok, few[:4], 4, 8)  # warm-up
    rows = [
        ("hf backend, batch 1", ours(model, tok, few, 1, args.new_tokens)),
        ("transformers generate, batch 1", reference(model, tok, few, 1, args.new_tokens)),
        (f"hf backend, batch {args.batch}", ours(model, tok, ids, args.batch, args.new_tokens)),
        (f"transformers generate, batch {args.batch}", reference(model, tok, ids, args.batch, args.new_tokens)),
    ]
    base = rows[1][1]
    print(f"{'configuration':<36} {'tokens/s':>10} {'vs generate b1':>15}")
    for name, tps in rows:
        print(f"{name:<36} {tps:>10.0f} {tps / base:>14.2f}x")
    print(f"batched speed-up of the hf backend over its own batch 1: {rows[2][1] / rows[0][1]:.2f}x")
    print(f"hf backend vs transformers generate at batch {args.batch}: {rows[2][1] / rows[3][1]:.2f}x")


if __name__ == "__main__":
    main()
