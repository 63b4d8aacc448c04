"""The real pretrained model (SmolLM2-135M-Instruct, ``pwopsd.rehearsal``) through vLLM's CPU build
and Hugging Face with the paper's evaluation prompt: the rehearsal's one-shot arithmetic problems.

float32: greedy vLLM equals greedy HF token for token. bfloat16 (the paper's dtype; slow on AVX2
CPUs, see docs/rehearsal.md, but it runs): the two engines round differently, so greedy decodes may
part; they must agree on the first tokens, and where one parts from the other, the two tokens must be
a near tie of the float32 model (a wrong weight, norm or rotary setting parts confidently, at once).
The snapshot folder comes in ``PWOPSD_REAL_MODEL`` (tests/test_vllm_cpu.py passes the session's);
without it these tests are skipped.
"""

from __future__ import annotations

import os

import pytest
import torch

from pwopsd.generation import GenerationRequest
from pwopsd.generation.sampling import eval_prompt_ids, make_backend
from test_vllm_engine import CPU_OPTIONS

MAX_MODEL_LEN = 1024
MAX_NEW_TOKENS = 48
NEAR_TIE = 0.5  # float32 logit gap (nats) under which bf16 rounding may swap two tokens


@pytest.fixture(scope="module")
def manifest():
    path = os.environ.get("PWOPSD_REAL_MODEL")
    if not path:
        pytest.skip("PWOPSD_REAL_MODEL (the real model's snapshot folder) is not set")
    return {"model": "smollm2_135m", "path": path}


@pytest.fixture(scope="module")
def tokenizer(manifest):
    from pwopsd.models import load_tokenizer

    return load_tokenizer(manifest)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    from pwopsd.tiny.arithmetic import problems_frame, sample_problems

    problems = problems_frame(sample_problems(seed=1001, n=6, levels=[1], max_operand=9), "a", example=True)
    return eval_prompt_ids(tokenizer, list(problems["problem"]), enable_thinking=True, add_special_tokens=True)


def greedy(prompts, tokenizer):
    return [GenerationRequest(tuple(p), temperature=0.0, max_new_tokens=MAX_NEW_TOKENS, stop_ids=(tokenizer.eos_token_id,))
            for p in prompts]


def both(manifest, tokenizer, prompts, dtype):
    requests = greedy(prompts, tokenizer)
    with make_backend("vllm", manifest, dtype=dtype, max_model_len=MAX_MODEL_LEN, options=CPU_OPTIONS) as engine:
        got = engine.generate(requests)
    hf = make_backend("hf", manifest, dtype=dtype, max_model_len=MAX_MODEL_LEN, tokenizer=tokenizer,
                      options={"hf_batch_size": 8}, progress=False)
    return got, hf.generate(requests)


def test_float32_greedy_vllm_equals_hf_and_stops_at_im_end(manifest, tokenizer, prompts):
    got, expected = both(manifest, tokenizer, prompts, "float32")
    same = [g[0].token_ids == e[0].token_ids for g, e in zip(got, expected)]
    assert all(same), f"greedy vLLM differs from greedy hf on {same.count(False)}/{len(same)} prompts"
    assert [g[0].finish_reason for g in got] == [e[0].finish_reason for e in expected]
    # The chat model ends its turn with <|im_end|> (its EOS, also its pad token): a stopped
    # completion ends there, and no completion holds a pad/EOS token before its end.
    eos = tokenizer.eos_token_id
    for c in (g[0] for g in got):
        assert eos not in c.token_ids[:-1]
    assert any(g[0].finish_reason == "stop" for g in got)


def test_bfloat16_greedy_vllm_and_hf_part_only_at_near_ties(manifest, tokenizer, prompts):
    from pwopsd.models import load_model

    got, expected = both(manifest, tokenizer, prompts, "bfloat16")
    reference = load_model(manifest, dtype="float32")
    parts = []
    for prompt, g, e in zip(prompts, got, expected):
        a, b = list(g[0].token_ids), list(e[0].token_ids)
        k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if k is None:
            continue
        with torch.no_grad():
            logits = reference(input_ids=torch.tensor([list(prompt) + a[:k]])).logits[0, -1]
        gap = abs(float(logits[a[k]] - logits[b[k]]))
        parts.append((k, gap))
        assert gap < NEAR_TIE, f"part at token {k} is no near tie: float32 logit gap {gap:.3f}"
    print(f"bf16 greedy: {len(prompts) - len(parts)}/{len(prompts)} equal; parts (token, gap): {parts}")
