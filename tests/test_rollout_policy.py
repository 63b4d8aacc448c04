"""The rollout policy (``training.rollout_policy``): ``adapter`` samples base + the current LoRA,
``merged_bf16`` the reference's policy, the LoRA merged into the bf16 base weights.

The merge is checked against two independent computations: bf16 rounding done on the bits of
float32 numbers with numpy, and PEFT's own ``merge_and_unload`` of a bf16 copy of the model (what
the reference's trainer runs). The rollouts of the ``merged_bf16`` policy come from those weights.
"""

import copy

import numpy as np
import pytest
import torch

from conftest import paper_train_config
from pwopsd.generation import GenerationRequest
from pwopsd.generation.rollout import HFRollouts, bf16_merged_weight, make_rollouts, merged_bf16_state_dict
from pwopsd.training.loop import Example, Trainer


def round_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bf16 value (ties to even), on their bits."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32)


def test_bf16_merge_equals_rounding_on_the_bits():
    rng = np.random.default_rng(0)
    w = round_to_bf16(rng.normal(0, 0.02, (48, 32)).astype(np.float32))  # bf16 base weights
    # LoRA factors on a coarse grid, so B @ A * 2 is exact in float32 before its one rounding
    a = rng.integers(-8, 9, (4, 32)).astype(np.float32) / 2**12
    b = rng.integers(-8, 9, (48, 4)).astype(np.float32) / 2**8
    delta = round_to_bf16((b.astype(np.float64) @ a.astype(np.float64) * 2.0).astype(np.float32))
    expected = round_to_bf16((w.astype(np.float64) + delta).astype(np.float32))
    got = bf16_merged_weight(torch.from_numpy(w), torch.from_numpy(a), torch.from_numpy(b), 2.0)
    assert got.dtype == torch.bfloat16
    np.testing.assert_array_equal(got.float().numpy(), expected)
    # What the reference loses: an update element below half a bf16 step of its weight is gone (a
    # step is 2^-7 of the weight's binade, half that just below a power of two: bound by 2^-9)
    quarter_step = 2.0 ** (np.floor(np.log2(np.abs(w))) - 9)
    lost = (np.abs(delta) < quarter_step) & (delta != 0)
    assert lost.any() and (got.float().numpy()[lost] == w[lost]).all()


@pytest.fixture()
def peft_model(random_tiny_model):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = get_peft_model(copy.deepcopy(random_tiny_model), LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], lora_dropout=0.0, task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:  # a trained adapter: B no longer zero, updates of mixed sizes
                p.copy_(torch.randn_like(p) * 10 ** torch.empty_like(p).uniform_(-4, -1))
    return model


def test_merged_weights_equal_peft_merging_a_bf16_copy(peft_model, random_tiny_model):
    ours = merged_bf16_state_dict(peft_model)
    reference = copy.deepcopy(peft_model).to(torch.bfloat16).merge_and_unload()  # the reference: all bf16, PEFT merges
    expected = dict(reference.named_parameters())
    assert set(ours) == set(expected) == set(dict(random_tiny_model.named_parameters()))
    for key, value in expected.items():
        assert ours[key].dtype == torch.bfloat16
        torch.testing.assert_close(ours[key], value.detach(), rtol=0, atol=0, msg=key)
    merged_layers = [k for k in ours if any(t in k for t in ("q_proj", "v_proj", "down_proj"))]
    base = dict(random_tiny_model.named_parameters())
    assert all(not torch.equal(ours[k], base[k].detach().to(torch.bfloat16)) for k in merged_layers)


def test_merged_policy_rollouts_come_from_the_merged_weights(peft_model, tiny_tokenizer):
    rollouts = HFRollouts(peft_model.get_base_model(), tiny_tokenizer, batch_size=8, policy="merged_bf16")
    assert rollouts.sync(peft_model, step=3) > 0
    reference = copy.deepcopy(peft_model).to(torch.bfloat16).merge_and_unload().float()
    prompts = [tuple(tiny_tokenizer.encode(f"What is {i} + {2 * i}?", add_special_tokens=False)) for i in range(1, 9)]
    reqs = [GenerationRequest(p, temperature=0.0, max_new_tokens=12) for p in prompts]
    ours = [c[0].token_ids for c in rollouts.generate(reqs)]
    expected = [c[0].token_ids for c in HFRollouts(reference, tiny_tokenizer, batch_size=8).generate(reqs)]
    assert ours == expected
    for name, p in rollouts.policy_model.named_parameters():  # fp32 as the trained model, bf16 values
        assert p.dtype == torch.float32 and torch.equal(p, p.to(torch.bfloat16).float()), name


def test_a_training_run_samples_the_configured_policy(tmp_path, random_tiny_model, tiny_tokenizer):
    from pwopsd.tiny.arithmetic import sample_problems

    examples = [Example(p.problem, p.reference_solution(), str(p.answer)) for p in sample_problems(3, 16, [1, 2], 20)]
    runs = {}
    for policy in ("adapter", "merged_bf16"):
        cfg = paper_train_config("pwopsd", lora_r=4, lora_alpha=8, lr=1e-3, max_steps=2, save_every=2, per_device_batch_size=4,
                                 gradient_accumulation_steps=1, max_completion_length=8, chunk_size=16, seed=7,
                                 rollout_policy=policy)
        trainer = Trainer(copy.deepcopy(random_tiny_model), tiny_tokenizer, examples, cfg, tmp_path / policy,
                          add_special_tokens=False)
        assert trainer.rollout_engine.policy == policy
        runs[policy] = trainer.train()
    assert all(h["sync_seconds"] == 0 for h in runs["adapter"])
    assert all(h["sync_seconds"] > 0 for h in runs["merged_bf16"])


def test_an_unknown_rollout_policy_is_named():
    with pytest.raises(ValueError, match="training.rollout_policy: unknown rollout policy 'merged'"):
        make_rollouts("hf", model=None, tokenizer=None, batch_size=1, model_path="", dtype="float32", lora_rank=4,
                      engine={}, sync_dir="unused", policy="merged")


# -- the rollout engine's runtime invariant (issue 52) ---------------------------------------------

def test_the_weights_fingerprint_is_exact_and_free_of_order_and_split():
    """Against Python's own integers: the sum modulo 2^64 of v*K1 + v*v*K2 over every element's bit
    pattern; the same for any order or split of the tensors; a weight one bf16 step up and another
    one step down change it (a plain sum of bit patterns would not see them)."""
    from pwopsd.generation.rollout import _MIX1, _MIX2, weights_fingerprint

    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(257, generator=gen).to(torch.bfloat16), torch.randn(3, 5, generator=gen)
    expected = sum(v * _MIX1 + v * v * _MIX2 for v in a.view(torch.int16).tolist() + b.view(torch.int32).flatten().tolist())
    assert weights_fingerprint([a, b]) == expected % 2**64
    assert weights_fingerprint([b, a]) == weights_fingerprint([a[:100], b, a[100:]]) == expected % 2**64
    moved = a.clone()
    moved.view(torch.int16)[3] += 1
    moved.view(torch.int16)[9] -= 1
    assert int(a.view(torch.int16).sum()) == int(moved.view(torch.int16).sum())
    assert weights_fingerprint([moved, b]) != weights_fingerprint([a, b])


def test_the_probe_stops_a_stale_engine_and_one_far_from_the_trainer_naming_the_step():
    from pwopsd.generation.rollout import EngineProbe, StaleEngineError

    probe = EngineProbe([1, 2, 3], "bfloat16")
    probe.check(0, fingerprint=7, engine=[-1.0, -2.0], trainer=[-1.1, -2.0])
    probe.check(1, fingerprint=7, engine=[-1.0, -2.0], trainer=[-1.1, -2.0])  # weights unchanged: same log-probs fine
    with pytest.raises(StaleEngineError, match="step 2: the synced policy's weights changed since step 1"):
        probe.check(2, fingerprint=8, engine=[-1.0, -2.0], trainer=[-1.05, -2.0])
    probe.check(2, fingerprint=8, engine=[-1.0, -2.0 + 2**-10], trainer=[-1.05, -2.0])
    # one token 0.3 away, the mean 0.075: a bf16 merge's rounding (SmolLM2: one token of 40 at 0.22)
    probe.check(3, fingerprint=9, engine=[-1.3, -2.0, -3.0, -4.0], trainer=[-1.0, -2.0, -3.0, -4.0])
    assert probe.max_difference == pytest.approx(0.3) and probe.max_mean_difference == pytest.approx(0.075)
    with pytest.raises(StaleEngineError, match=r"step 4: .* differ from the trainer's by 0\.55 on average, up to 0\.6"):
        probe.check(4, fingerprint=10, engine=[-1.6, -2.5], trainer=[-1.0, -2.0])
    assert probe.tolerance == 0.25 and EngineProbe([1], "float32").tolerance == 2**-10
