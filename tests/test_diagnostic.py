"""Phase C candidate filters on crafted distributions; Phase D MC-dropout hooks leave the model
unchanged afterwards."""

import numpy as np
import pytest

from pwopsd.diagnostic.branch_points import mc_dropout, select_candidates, truncated_entropy

EOS, SPECIAL = 0, 1
VALID = lambda i: i not in (EOS, SPECIAL)  # noqa: E731


def dist(T, rows):
    """[T, 4] top ids/probs; default rows are confident (not plausible)."""
    ids = np.tile(np.array([10, 11, 12, 13]), (T, 1))
    probs = np.tile(np.array([0.97, 0.01, 0.01, 0.01]), (T, 1))
    for t, (i, p) in rows.items():
        ids[t], probs[t] = i, p
    return ids, probs


@pytest.mark.vllm_stack
def test_truncated_entropy_renormalizes_valid_top_m():
    assert truncated_entropy([0.5, 0.25, 0.25], [True, True, True]) == pytest.approx(1.0397, abs=1e-4)
    assert truncated_entropy([0.4, 0.3, 0.3], [False, True, True]) == pytest.approx(np.log(2))
    assert truncated_entropy([0.5, 0.3, 0.2], [True, True, True], top_m=1) == 0.0


@pytest.mark.vllm_stack
def test_truncated_entropy_readings_differ_only_where_junk_ranks_in_the_top_m():
    """valid_in_top_m: the valid tokens among the top M; top_m_valid: the M most probable valid
    tokens (reaching past a junk token into the stored tail)."""
    probs, valid = [0.4, 0.3, 0.2, 0.1], [True, False, True, True]
    assert truncated_entropy(probs, valid, 3, "valid_in_top_m") == pytest.approx(_entropy([0.4, 0.2]))
    assert truncated_entropy(probs, valid, 3, "top_m_valid") == pytest.approx(_entropy([0.4, 0.2, 0.1]))
    all_valid = [True] * 4
    assert truncated_entropy(probs, all_valid, 3, "valid_in_top_m") == truncated_entropy(probs, all_valid, 3, "top_m_valid")
    with pytest.raises(ValueError, match="diagnostic.teacher_pass.h_trunc"):
        truncated_entropy(probs, valid, 3, "both")


def _entropy(p):
    q = np.asarray(p) / np.sum(p)
    return float(-(q * np.log(q)).sum())


@pytest.mark.vllm_stack
def test_plausibility_filter_boundaries():
    ids, probs = dist(300, {
        10: ([10, 11, 12, 13], [0.20, 0.02, 0.01, 0.01]),   # p2 = 0.02 and p2/p1 = 0.10: kept (both >=)
        80: ([10, 11, 12, 13], [0.30, 0.0299, 0.01, 0.01]),  # p2/p1 < 0.10: dropped
        160: ([10, 11, 12, 13], [0.15, 0.019, 0.01, 0.01]),  # p2 < 0.02: dropped
        240: ([EOS, 11, 12, 13], [0.5, 0.3, 0.1, 0.1]),     # EOS skipped: valid p1=0.3, p2=0.1 -> kept
    })
    got = select_candidates(ids, probs, VALID, boxed_start=None)
    assert [c.position for c in got] == [10, 240]
    assert got[1].children == [11, 12, 13] and got[1].p1 == 0.3


@pytest.mark.vllm_stack
def test_spacing_boxed_and_top_five_by_entropy():
    rows = {t: ([10, 11, 12, 13], [0.4, 0.3, 0.2 + 0.0001 * t, 0.1]) for t in range(0, 1000, 10)}
    ids, probs = dist(1000, rows)
    got = select_candidates(ids, probs, VALID, boxed_start=700)
    positions = [c.position for c in got]
    assert len(got) == 5 and max(positions) < 700
    assert all(b - a >= 64 for a, b in zip(positions, positions[1:]))
    # Entropy grows with t here: greedy from 690 down, each next one at least 64 tokens away.
    assert positions == [410, 480, 550, 620, 690]
    assert all(len(c.children) == 3 for c in got)


def test_mc_dropout_hooks_are_removed(random_tiny_model):
    import torch

    model = random_tiny_model
    x = torch.tensor([[3, 4, 5, 6, 7]])
    with torch.no_grad():
        before = model(input_ids=x).logits
        with mc_dropout(model, last_layers=2, p=0.5, layers="model.layers"):
            a = model(input_ids=x).logits
            b = model(input_ids=x).logits
        after = model(input_ids=x).logits
    assert not torch.equal(a, b) and not torch.equal(a, before)  # dropout active inside
    assert torch.equal(before, after)  # and gone afterwards
    with pytest.raises(RuntimeError):
        with mc_dropout(model, last_layers=2, p=0.1, layers="model.layers"):
            raise RuntimeError("boom")
    with torch.no_grad():
        assert torch.equal(model(input_ids=x).logits, before)
    assert all(len(layer._forward_hooks) == 0 for layer in model.model.layers)


def test_teacher_pass_streams_the_same_distribution(random_tiny_model):
    import torch

    from pwopsd.diagnostic.branch_points import teacher_pass

    prompt, spine = [3, 4, 5, 6], [7, 8, 9, 10, 11, 12, 13]
    out = teacher_pass(random_tiny_model, prompt, spine, top_k=5, chunk_size=3)
    with torch.no_grad():
        logits = random_tiny_model(input_ids=torch.tensor([prompt + spine])).logits[0, len(prompt) - 1 : -1]
    logp = torch.log_softmax(logits.float(), -1)
    np.testing.assert_allclose(out["entropy"], (-(logp.exp() * logp).sum(-1)).numpy(), rtol=1e-5, atol=1e-6)
    vals, idx = logp.topk(5, -1)
    assert (out["top_ids"] == idx.numpy()).all()
    np.testing.assert_allclose(out["top_probs"], vals.exp().numpy(), rtol=1e-5)
    assert out["entropy"].shape == (len(spine),)


@pytest.mark.vllm_stack
def test_forced_continuation_requests():
    from pwopsd.diagnostic.branch_points import forced_continuation_requests

    reqs = forced_continuation_requests([1, 2], [10, 11, 12, 13], 2, [20, 21, 22], n=6, seed=0, max_model_len=12)
    assert [r.prompt_ids for r in reqs] == [(1, 2, 10, 11, 20), (1, 2, 10, 11, 21), (1, 2, 10, 11, 22)]
    assert all(r.n == 6 and r.temperature == 1.0 and r.top_p == 0.95 and r.max_new_tokens == 7 for r in reqs)
    assert len({r.seed for r in reqs}) == 3
    # diagnostic.forced_continuation.max_new_tokens (beyond the paper): a cap below the model length's room
    capped = forced_continuation_requests([1, 2], [10, 11, 12, 13], 2, [20], max_model_len=12, max_new_tokens=3)
    assert capped[0].max_new_tokens == 3
    assert forced_continuation_requests([1, 2], [10, 11, 12, 13], 2, [20], max_model_len=12, max_new_tokens=50)[0].max_new_tokens == 7
    with pytest.raises(ValueError, match="does not fit max_model_len=4"):
        forced_continuation_requests([1, 2], [10, 11, 12], 2, [20], max_model_len=4)
