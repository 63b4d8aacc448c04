"""Generation backends: the sampling filter against an independent computation, per-request
seeding independent of batch composition, stop/EOS/length handling, greedy equivalence with
transformers' own generate, and the vLLM request mapping."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from pwopsd import prompts
from pwopsd.generation import FINISH_LENGTH, FINISH_STOP, GenerationRequest, get_backend, stream_seed
from pwopsd.generation.hf_backend import HFBackend, filter_and_sample, shared_prompts


def _nucleus_probs(logits, temperature, top_p, top_k):
    """Independent numpy reference of temperature -> top-k -> top-p -> renormalize."""
    z = np.asarray(logits, dtype=np.float64) / temperature
    order = np.argsort(-z, kind="stable")
    p = np.exp(z - z.max())
    p /= p.sum()
    keep = np.zeros_like(p, dtype=bool)
    k = len(p) if top_k <= 0 else top_k
    topk = order[:k]
    pk = p[topk] / p[topk].sum()
    mass = 0.0
    for rank, tok in enumerate(topk):
        keep[tok] = True
        mass += pk[rank]
        if mass >= top_p:
            break
    q = np.where(keep, p, 0.0)
    return q / q.sum()


@pytest.mark.parametrize("temperature,top_p,top_k", [(1.0, 1.0, 0), (1.0, 0.9, 0), (0.7, 0.95, 0), (1.3, 1.0, 3), (1.0, 0.5, 4)])
def test_sampler_matches_reference_distribution(temperature, top_p, top_k):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 12, generator=gen) * 2
    expected = _nucleus_probs(logits[0].numpy(), temperature, top_p, top_k)
    grid = torch.linspace(0, 1, 20001)[:-1] + 0.5 / 20000  # deterministic "uniforms"
    rows = logits.expand(len(grid), -1)
    f = lambda v, dt: torch.full((len(grid),), v, dtype=dt)
    tokens = filter_and_sample(rows, f(temperature, torch.float32), f(top_p, torch.float32), f(top_k, torch.long), grid)
    freq = np.bincount(tokens.numpy(), minlength=12) / len(grid)
    assert set(np.flatnonzero(freq)) == set(np.flatnonzero(expected))
    np.testing.assert_allclose(freq, expected, atol=2e-4)


def test_sampler_window_gives_the_tokens_of_a_full_sort():
    """Rows whose top-k cut or nucleus lies within the sorted window, and rows whose nucleus does
    not (flat distributions, a top-k beyond the window), sample the token a full sort gives, for
    every uniform draw; and the window's rows follow the reference distribution."""
    gen = torch.Generator().manual_seed(1)
    vocab, n = 512, 4000
    sharp = torch.randn(n, vocab, generator=gen) * 6  # nucleus of a few tokens
    flat = torch.randn(n, vocab, generator=gen) * 0.3  # nucleus of hundreds
    logits = torch.cat([sharp, flat])
    rows = len(logits)
    temperature = torch.rand(rows, generator=gen) * 1.2 + 0.3
    top_p = torch.rand(rows, generator=gen) * 0.5 + 0.5
    top_k = torch.tensor([0, 20, 100, vocab, vocab + 5, -1]).repeat(rows // 6 + 1)[:rows]
    uniforms = torch.rand(rows, generator=gen)
    windowed = filter_and_sample(logits, temperature, top_p, top_k, uniforms, window=64)
    full = filter_and_sample(logits, temperature, top_p, top_k, uniforms, window=vocab)
    assert torch.equal(windowed, full)
    # one sharp row, sampled on a grid of uniforms, against the independent reference
    row, grid = sharp[:1] * 0.8, torch.linspace(0, 1, 20001)[:-1] + 0.5 / 20000
    f = lambda v, dt: torch.full((len(grid),), v, dtype=dt)  # noqa: E731
    tokens = filter_and_sample(row.expand(len(grid), -1), f(1.0, torch.float32), f(0.9, torch.float32), f(0, torch.long), grid)
    expected = _nucleus_probs(row[0].numpy(), 1.0, 0.9, 0)
    assert 1 < (expected > 0).sum() < 64  # the nucleus lies within the window
    np.testing.assert_allclose(np.bincount(tokens.numpy(), minlength=vocab) / len(grid), expected, atol=2e-4)


def test_sampler_greedy_and_mixed_rows():
    logits = torch.tensor([[0.1, 3.0, 0.2], [5.0, 0.0, 4.9], [0.0, 0.0, 9.0]])
    t = torch.tensor([0.0, 0.0, 1.0])
    out = filter_and_sample(logits, t, torch.ones(3), torch.zeros(3, dtype=torch.long), torch.tensor([0.99, 0.99, 0.5]))
    assert out.tolist() == [1, 0, 2]


def _ids(tok, problem, style=prompts.EVAL):
    return tuple(prompts.encode(tok, prompts.render(tok, prompts.eval_message(problem), style), add_special_tokens=False))


@pytest.fixture(scope="module")
def backend(random_tiny_model, tiny_tokenizer):
    return HFBackend(random_tiny_model, tiny_tokenizer, batch_size=8)


def test_same_seed_same_tokens_regardless_of_batch(backend, tiny_tokenizer):
    target = GenerationRequest(_ids(tiny_tokenizer, "Compute 3 + 4."), n=3, seed=11, top_p=0.95, max_new_tokens=24)
    alone = backend.generate([target])[0]
    others = [GenerationRequest(_ids(tiny_tokenizer, f"Compute {i} + {i} - 1 + {2 * i}."), n=2, seed=i, max_new_tokens=30) for i in range(5)]
    mixed = backend.generate(others[:2] + [target] + others[2:])[2]
    small = HFBackend(backend.model, tiny_tokenizer, batch_size=2).generate(others[:1] + [target])[1]
    # Every sample with its own prefill (the others share their prompt's).
    single = HFBackend(backend.model, tiny_tokenizer, batch_size=8, share_prefill=False).generate([target])[0]
    for a, b, c, d in zip(alone, mixed, small, single):
        assert a.token_ids == b.token_ids == c.token_ids == d.token_ids
    assert len({tuple(c.token_ids) for c in alone}) > 1  # the n samples differ
    # vLLM convention: sample j draws with the request's base seed + j (a shared-stream request
    # with that seed, sample 0, is the same draw), whether the base seed is per prompt (the
    # default, as ``target``) or the seed itself.
    for streams in ("shared", "per_prompt"):
        req = GenerationRequest(target.prompt_ids, n=3, seed=11, top_p=0.95, max_new_tokens=24, streams=streams)
        samples = backend.generate([req])[0]
        assert (samples == alone) == (streams == "per_prompt")
        shifted = backend.generate([GenerationRequest(target.prompt_ids, n=1, seed=req.base_seed() + 1, top_p=0.95,
                                                      max_new_tokens=24, streams="shared")])[0][0]
        assert shifted.token_ids == samples[1].token_ids
    other_seed = backend.generate([GenerationRequest(target.prompt_ids, n=3, seed=99, top_p=0.95, max_new_tokens=24)])[0]
    assert [c.token_ids for c in other_seed] != [c.token_ids for c in alone]


def test_each_problem_and_seed_has_streams_of_its_own():
    """Per-prompt streams: no two (seed, prompt) pairs of an evaluation share a generator seed,
    whatever n; shared streams (the reference's) give every prompt seed + j."""
    prompts_ = [tuple(range(k, k + 1 + k % 7)) for k in range(300)]
    seeds = (0, 1, 2, 3)
    drawn = [GenerationRequest(p, n=12, seed=s, streams="per_prompt").sample_seed(j)
             for s in seeds for p in prompts_ for j in range(12)]
    assert len(set(drawn)) == len(drawn)
    base = sorted(GenerationRequest(p, n=12, seed=s, streams="per_prompt").base_seed() for s in seeds for p in prompts_)
    assert min(b - a for a, b in zip(base, base[1:])) >= 12  # no stream window overlaps another
    assert max(base) + 12 < 2**63
    # By content: a list and a tuple of the same ids, and seed None with the backend default 0.
    assert stream_seed(3, [5, 6]) == stream_seed(3, (5, 6)) == GenerationRequest((5, 6), seed=3, streams="per_prompt").base_seed()
    assert GenerationRequest((5, 6), streams="per_prompt").base_seed(default_seed=3) == stream_seed(3, (5, 6))
    assert stream_seed(3, (5, 6)) != stream_seed(3, (6, 5)) != stream_seed(4, (6, 5))
    assert GenerationRequest((5, 6), seed=3).base_seed() == stream_seed(3, (5, 6))  # the default: per prompt
    shared = [GenerationRequest(p, n=12, seed=1, streams="shared") for p in prompts_[:3]]  # the reference's
    assert {tuple(r.sample_seed(j) for j in range(12)) for r in shared} == {tuple(range(1, 13))}
    with pytest.raises(ValueError, match="streams"):
        GenerationRequest((1,), streams="per_problem")


def test_shared_streams_tie_problems_and_seeds_together_and_per_prompt_streams_do_not(backend, tiny_tokenizer):
    """Why per-prompt streams: with shared ones (seed + j for every prompt) the hf sampler's inverse
    CDF ties sample j of every problem to one uniform, so problems whose next-token distributions
    agree get the same samples, and seed s + 1 repeats n - 1 of seed s's samples."""
    ids = _ids(tiny_tokenizer, "Compute 3 + 4.")
    req = lambda streams, seed: GenerationRequest(ids, n=4, seed=seed, top_p=0.95, max_new_tokens=24,  # noqa: E731
                                                  streams=streams)
    # One prompt as two problems of the same seed: one distribution, the same uniforms, one sample.
    a, b = backend.generate([req("shared", 5), req("shared", 5)])
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    shared5, shared6, five, six = backend.generate([req("shared", 5), req("shared", 6), req("per_prompt", 5),
                                                    req("per_prompt", 6)])
    assert [c.token_ids for c in shared5[1:]] == [c.token_ids for c in shared6[:3]]
    assert [c.token_ids for c in five[1:]] != [c.token_ids for c in six[:3]]


def test_shared_prompts_index_each_row_by_its_first_appearance():
    assert shared_prompts([(1, 2), (3,), (1, 2), (3,), (4, 5)]) == ([0, 1, 0, 1, 2], [(1, 2), (3,), (4, 5)])


def test_greedy_matches_transformers_generate(backend, random_tiny_model, tiny_tokenizer):
    reqs = [GenerationRequest(_ids(tiny_tokenizer, p), temperature=0.0, max_new_tokens=16)
            for p in ("Compute 1 + 1.", "Compute 12 - 7 + 30 - 2.")]
    ours = backend.generate(reqs + reqs)  # each prompt twice: one prefill shared by two requests
    assert ours[:2] == ours[2:]
    for req, out in zip(reqs, ours):
        ref = random_tiny_model.generate(torch.tensor([req.prompt_ids]), attention_mask=torch.ones(1, len(req.prompt_ids), dtype=torch.long),
                                         do_sample=False, max_new_tokens=16, eos_token_id=tiny_tokenizer.eos_token_id,
                                         pad_token_id=tiny_tokenizer.pad_token_id)
        ref_new = ref[0, len(req.prompt_ids):].tolist()
        assert out[0].token_ids == ref_new[: len(out[0].token_ids)]


def test_stop_token_ends_the_sample_and_is_kept(backend, tiny_tokenizer):
    base = GenerationRequest(_ids(tiny_tokenizer, "Compute 5 - 3."), temperature=0.0, max_new_tokens=12)
    full = backend.generate([base])[0][0]
    assert full.finish_reason == FINISH_LENGTH and len(full.token_ids) == 12
    stop_tok = full.token_ids[4]
    first = full.token_ids.index(stop_tok)
    stopped = backend.generate([GenerationRequest(base.prompt_ids, temperature=0.0, max_new_tokens=12, stop_ids=(stop_tok,))])[0][0]
    assert stopped.finish_reason == FINISH_STOP
    assert stopped.token_ids == full.token_ids[: first + 1]
    # The same token configured as EOS of the backend behaves identically.
    eos_backend = HFBackend(backend.model, tiny_tokenizer, eos_ids=[stop_tok])
    assert eos_backend.generate([base])[0][0].token_ids == stopped.token_ids


def test_eos_is_stripped_from_text(tiny_tokenizer):
    from pwopsd.generation.hf_backend import default_eos_ids

    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[2, 7]))
    assert default_eos_ids(model, tiny_tokenizer) == sorted({tiny_tokenizer.eos_token_id, 2, 7})


def test_request_validation():
    with pytest.raises(ValueError, match="greedy"):
        GenerationRequest((1, 2), n=2, temperature=0.0)
    with pytest.raises(ValueError, match="top_p"):
        GenerationRequest((1,), top_p=0.0)
    with pytest.raises(ValueError, match="empty prompt"):
        GenerationRequest(())
    with pytest.raises(ValueError, match="unknown generation backend"):
        get_backend("tgi")


def test_one_job_for_every_seed_writes_the_files_of_one_job_per_seed(tmp_path, random_tiny_model, tiny_tokenizer):
    """evaluation.seeds_per_job: all (tiny mode) samples every seed in one process: the files equal
    those of separate per-seed jobs (samples and metadata; only the recorded wall time differs)."""
    import pandas as pd

    from pwopsd.generation.sampling import run_generations
    from pwopsd.io import read_parquet_metadata

    random_tiny_model.save_pretrained(tmp_path / "model")
    tiny_tokenizer.save_pretrained(tmp_path / "model")
    bench = [("a", pd.DataFrame({"id": ["p0", "p1", "p2"], "problem": ["Compute 1 + 2.", "Compute 3 - 1.", "Compute 4 + 4."]})),
             ("b", pd.DataFrame({"id": ["q0"], "problem": ["Compute 9 - 2."]}))]
    settings = {"n": 3, "temperature": 1.0, "top_p": 0.95, "top_k": -1, "min_p": 0.0, "max_new_tokens": 10,
                "max_model_len": 256, "enable_thinking": True}
    common = dict(benchmarks=bench, manifest={"path": str(tmp_path / "model")}, settings=settings,
                  chat_template={"add_special_tokens": False}, dtype="float32", backend_name="hf",
                  backend_options={"hf_batch_size": 4}, metadata={"model": "m"})
    seeds = {"main": None, "1": 1}

    def outs(root, seed_name):
        return [tmp_path / root / f"{b}-{seed_name}.parquet" for b, _ in bench]

    run_generations(seeds={s: (v, outs("together", s)) for s, v in seeds.items()}, **common)
    for s, v in seeds.items():
        run_generations(seeds={s: (v, outs("apart", s))}, **common)
    for s in seeds:
        for together, apart in zip(outs("together", s), outs("apart", s)):
            pd.testing.assert_frame_equal(pd.read_parquet(together), pd.read_parquet(apart))
            meta = [{k: v for k, v in read_parquet_metadata(f).items() if k != "seconds"} for f in (together, apart)]
            assert meta[0] == meta[1] and meta[0]["seed_name"] == s
    assert not pd.read_parquet(outs("together", "main")[0]).equals(pd.read_parquet(outs("together", "1")[0]))
