"""How far the reference's rollout policy (``merged_bf16``) is from the trained one (``adapter``).

The reference's trainer merges the LoRA into the bf16 base weights before every vLLM sync, so an
update smaller than half a bf16 step of its base weight is rounded away and the rollouts come from
a policy that lags the trained one (``training.rollout_policy``, docs/decisions.md, "Rollouts").
This script trains the tiny model in bf16 (``hf`` rollouts, the ``adapter`` policy, the tiny
config's training settings with ``--lr``) and, after steps 0, 1, k and 2k, measures on that step's
on-policy rollouts (sampled at the rollout temperature from the trained policy):

- ``KL(adapter || merged)``: per-token KL between the next-token distributions (at the rollout
  temperature) of the trained policy and of the same weights merged into bf16;
- ``KL(step t || t+1)``: the same between the trained policy and the one a single optimizer step
  later: how much one update moves the policy, the scale the first is compared with;
- their ratio, and the share of the LoRA update that survives the merge
  (``<W_merged - W, dW> / |dW|^2`` over every merged layer) with the share of weight elements the
  merge leaves unchanged although the update moved them.

Deterministic (seeded), so a single run is the figure; the paper's lr is 5e-6, the tiny config's 1e-3::

    .venv/bin/python benchmarks/rollout_policy_kl.py --model tiny/results/models/tiny_qwen3/base --lr 5e-6 1e-3

The tiny model's weights are not Qwen3-4B's (other widths, other scales), so the numbers say how the
effect behaves with the learning rate and over steps, not its size at the paper's shape.
"""

from __future__ import annotations

import argparse
import copy
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def token_kl(logits_p, logits_q, temperature: float):
    """Mean over positions of KL(p || q) between softmax(logits / temperature) rows."""
    import torch

    lp = torch.log_softmax(logits_p.float() / temperature, dim=-1)
    lq = torch.log_softmax(logits_q.float() / temperature, dim=-1)
    return float((lp.exp() * (lp - lq)).sum(-1).mean())


def completion_logits(model, prompts, completions):
    """Logits at the positions that predict each completion token, one sequence at a time (no
    padding), concatenated over the sequences."""
    import torch

    rows = []
    with torch.no_grad():
        for p, c in zip(prompts, completions):
            if not c:
                continue
            ids = torch.tensor([list(p) + list(c)])
            out = model(input_ids=ids).logits[0]
            rows.append(out[len(p) - 1 : len(p) - 1 + len(c)])
    return torch.cat(rows)


def update_kept(peft_model) -> tuple[float, float]:
    """(share of the LoRA update kept by the bf16 merge, share of moved elements left unchanged)."""
    import torch
    from peft.tuners.lora import LoraLayer

    from pwopsd.generation.rollout import bf16_merged_weight

    num = den = 0.0
    moved = lost = 0
    name = peft_model.active_adapter
    for m in peft_model.get_base_model().modules():
        if isinstance(m, LoraLayer) and name in m.lora_A:
            w = m.base_layer.weight.detach().float()
            dw = (m.lora_B[name].weight.detach().float() @ m.lora_A[name].weight.detach().float()) * m.scaling[name]
            kept = bf16_merged_weight(m.base_layer.weight, m.lora_A[name].weight, m.lora_B[name].weight,
                                      m.scaling[name]).float() - w
            num += float((kept * dw).sum())
            den += float((dw * dw).sum())
            nonzero = dw != 0
            moved += int(nonzero.sum())
            lost += int((nonzero & (kept == 0)).sum())
    return (num / den if den else float("nan")), (lost / moved if moved else float("nan"))


def measure(model_dir: str, lr: float, k: int, n_problems: int) -> list[dict]:
    import torch
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    from pwopsd.config import load_config, training_config
    from pwopsd.generation.rollout import HFRollouts
    from pwopsd.models import load_model, load_tokenizer
    from pwopsd.tiny.arithmetic import sample_problems
    from pwopsd.training.loop import Example, TrainConfig, Trainer

    torch.manual_seed(0)
    manifest = {"path": model_dir}
    tok = load_tokenizer(manifest)
    cfg = load_config(REPO / "tiny" / "config" / "config.yaml")
    settings = {**training_config(cfg, "tiny_qwen3", "opsd"), "lr": lr, "rollout_backend": "hf", "rollout_engine": {},
                "rollout_policy": "adapter", "per_device_batch_size": n_problems, "gradient_accumulation_steps": 1}
    train = TrainConfig(**settings)
    problems = sample_problems(17, n_problems * (2 * k + 2), [1, 2, 3], 20)
    examples = [Example(p.problem, p.reference_solution(), str(p.answer)) for p in problems]
    with tempfile.TemporaryDirectory() as work:
        trainer = Trainer(load_model(manifest, dtype="bfloat16"), tok, examples, train, work, add_special_tokens=False)
        states, rollouts = {}, {}
        for t in range(2 * k + 2):  # the policy after t steps, and the step-t rollouts sampled from it
            states[t] = {key: v.clone() for key, v in get_peft_model_state_dict(trainer.model).items()}
            idx = trainer.batch_indices(t)
            rollouts[t] = ([trainer.student_ids[i] for i in idx], trainer.rollouts(idx, t))
            trainer.train_step()
        merged = HFRollouts(trainer.inner, tok, batch_size=1, policy="merged_bf16")
        rows = []
        for t in sorted({0, 1, k, 2 * k}):
            prompts, completions = rollouts[t]
            set_peft_model_state_dict(trainer.model, states[t + 1])
            trainer.model.eval()
            later = completion_logits(trainer.model, prompts, completions)
            set_peft_model_state_dict(trainer.model, states[t])
            trainer.model.eval()
            trained = completion_logits(trainer.model, prompts, completions)
            merged.sync(trainer.model, t)
            lagging = completion_logits(merged.policy_model, prompts, completions)
            kept, unchanged = update_kept(trainer.model)
            kl_merge, kl_step = token_kl(trained, lagging, train.temperature), token_kl(trained, later, train.temperature)
            rows.append({"step": t, "tokens": len(trained), "kl_merge": kl_merge, "kl_step": kl_step,
                         "ratio": kl_merge / kl_step if kl_step else float("nan"), "kept": kept, "unchanged": unchanged})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(REPO / "tiny" / "results" / "models" / "tiny_qwen3" / "base"))
    ap.add_argument("--lr", type=float, nargs="+", default=[5e-6, 1e-3])
    ap.add_argument("--k", type=int, default=8, help="measure after steps 0, 1, k and 2k")
    ap.add_argument("--problems", type=int, default=32, help="rollouts per step")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(2)
    print("| lr | step | tokens | KL(adapter ‖ merged) | KL(step t ‖ t+1) | ratio | update kept by the merge | moved elements the merge leaves unchanged |")
    print("|---|---|---|---|---|---|---|---|")
    for lr in args.lr:
        for r in measure(args.model, lr, args.k, args.problems):
            print(f"| {lr:g} | {r['step']} | {r['tokens']} | {r['kl_merge']:.3g} | {r['kl_step']:.3g} | {r['ratio']:.3g} | "
                  f"{r['kept']:.1%} | {r['unchanged']:.1%} |")


if __name__ == "__main__":
    main()
