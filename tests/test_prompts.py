"""Prompt templates equal the reference's verbatim strings (read from the spec), and render
through a Qwen3-style chat template with the think-closure rule."""

import ast
import re

import pytest

from conftest import SPEC, require_shared
from pwopsd import prompts

pytestmark = pytest.mark.vllm_stack  # also run under the vLLM stack (tests/test_vllm_stack.py)


def _spec_repr(after: str) -> str:
    text = require_shared(SPEC / "reference_implementation.md").read_text()
    start = text.index(after)
    block = re.search(r"```\n(.*?)\n```", text[start:], re.S).group(1)
    return ast.literal_eval(block)


def test_templates_are_verbatim_from_the_reference():
    assert prompts.STUDENT_TRAIN_TEMPLATE == _spec_repr("Student user message (training)")
    assert prompts.TEACHER_TRAIN_TEMPLATE == _spec_repr("Teacher (privileged) user message (training)")
    assert prompts.EVAL_TEMPLATE == _spec_repr("Evaluation user message")
    assert "\u2014" in prompts.TEACHER_TRAIN_TEMPLATE  # the em-dash


def test_the_teacher_template_without_its_transition_keeps_everything_else():
    """training.teacher_transition: false: the paper's privileged template with only its transition
    paragraph left out (the solution block, then the boxed instruction). Torch-free: it also runs under
    the vLLM stack; what training feeds from it is tested in tests/test_training.py."""
    paper = prompts.teacher_message("Compute 9 + 6.", "9 + 6 = 15")
    plain = prompts.teacher_message("Compute 9 + 6.", "9 + 6 = 15", transition=False)
    assert paper.replace(prompts.TEACHER_TRANSITION, "") == plain and prompts.TEACHER_TRANSITION not in plain
    assert plain == ("Problem: Compute 9 + 6.\n\nHere is a reference solution to this problem:\n=== Reference Solution Begin ===\n"
                     "9 + 6 = 15\n=== Reference Solution End ===\n\n" + prompts.BOXED_INSTRUCTION)


def test_messages_substitute_literally():
    assert prompts.eval_message("What is $\\{1,2\\}$?") == "What is $\\{1,2\\}$?\n\nPlease reason step by step, and put your final answer within \\boxed{}."
    t = prompts.teacher_message("P {x}", "S with {problem}")
    assert t.startswith("Problem: P {x}\n\nHere is a reference solution to this problem:\n=== Reference Solution Begin ===\nS with {problem}\n")
    assert prompts.student_message("2+2?").startswith("Problem: 2+2?\n\nPlease reason")


@pytest.mark.parametrize(
    "rendered,closed",
    [
        ("<|User|>q<|Assistant|><think>\n", True),  # DSR1 style
        ("<|im_start|>assistant\n<think>", True),  # Olmo-3-Think style, no newline
        ("<|im_start|>assistant\n<think >  \n", True),
        ("<|im_start|>assistant\n<think>\n\n</think>\n\n", False),  # Qwen3, thinking off
        ("<|im_start|>assistant\n", False),
        ("<think>\nsomething", False),
    ],
)
def test_think_closure(rendered, closed):
    out = prompts.apply_think_closure(rendered)
    assert out == (rendered + "</think>\n\n" if closed else rendered)


def test_tiny_chat_template_follows_qwen3(tiny_tokenizer):
    msg = prompts.eval_message("Compute 1 + 2.")
    on = prompts.render(tiny_tokenizer, msg, prompts.EVAL)
    off = prompts.render(tiny_tokenizer, prompts.student_message("Compute 1 + 2."), prompts.STUDENT)
    assert on == f"<|im_start|>user\n{msg}<|im_end|>\n<|im_start|>assistant\n"
    assert off.endswith("<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    # Thinking-off Qwen3 prompts are already closed: the closure adds nothing.
    assert prompts.apply_think_closure(off) == off
    teacher = prompts.render(tiny_tokenizer, prompts.teacher_message("Compute 1 + 2.", "The answer is 3."), prompts.TEACHER)
    assert teacher.endswith("<|im_start|>assistant\n") and "=== Reference Solution Begin ===\nThe answer is 3.\n" in teacher


def test_tokenizer_round_trip_and_specials(tiny_tokenizer):
    text = "<think>\n12 + 7 = 19\n</think>\n\nThe answer is \\boxed{19}."
    ids = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tiny_tokenizer.decode(ids) == text
    assert tiny_tokenizer.decode(tiny_tokenizer("1234", add_special_tokens=False)["input_ids"][:1]) == "1"  # digits split
    assert tiny_tokenizer.eos_token == "<|im_end|>" and tiny_tokenizer.pad_token == "<|endoftext|>"
    assert tiny_tokenizer.pad_token_id != tiny_tokenizer.eos_token_id  # as on Qwen3: EOS is supervised
    assert tiny_tokenizer.decode([tiny_tokenizer.eos_token_id], skip_special_tokens=True) == ""
    assert "<think>" in tiny_tokenizer.decode(tiny_tokenizer("<think>", add_special_tokens=False)["input_ids"], skip_special_tokens=True)


def test_tokenizer_save_load_round_trip(tiny_tokenizer, tmp_path):
    from transformers import AutoTokenizer

    tiny_tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    msg = prompts.eval_message("Compute 3 - 1.")
    assert prompts.render(loaded, msg, prompts.EVAL) == prompts.render(tiny_tokenizer, msg, prompts.EVAL)
    assert loaded("x = 1")["input_ids"] == tiny_tokenizer("x = 1")["input_ids"]
    assert loaded.padding_side == "left"
