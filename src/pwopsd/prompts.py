"""Prompt templates of the paper and the reference implementation, verbatim.

Three user messages exist (``../shared/spec/reference_implementation.md`` §1.3):

* the **student** training message  ``Problem: {problem}\\n\\nPlease reason ...``
  rendered with ``enable_thinking=False`` and the *think-closure* rule;
* the **privileged teacher** training message (problem + reference solution), rendered with
  ``enable_thinking=True`` and *no* think-closure (the reference closes only student prompts);
* the **evaluation** message ``{problem}\\n\\nPlease reason ...`` rendered with
  ``enable_thinking=True`` and no think-closure.

Placeholders are substituted with ``str.replace`` rather than ``str.format`` because the
templates contain literal braces (``\\boxed{}``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."

STUDENT_TRAIN_TEMPLATE = "Problem: {problem}\n\n" + BOXED_INSTRUCTION

# transition_prompt starts with "\n\n" and ends with ":\n"; note the em-dash (U+2014).
TEACHER_TRANSITION = (
    "\n\nAfter reading the reference solution above, make sure you truly understand the reasoning "
    "behind each step \u2014 do not copy or paraphrase it. Now, using your own words and independent "
    "reasoning, derive the same final answer to the problem above. Think step by step, explore "
    "different approaches, and don't be afraid to backtrack or reconsider if something doesn't "
    "work out:\n"
)

TEACHER_TRAIN_TEMPLATE = (
    "Problem: {problem}\n\n"
    + "Here is a reference solution to this problem:\n"
    + "=== Reference Solution Begin ===\n{solution}\n=== Reference Solution End ===\n"
    + TEACHER_TRANSITION
    + "\n"
    + BOXED_INSTRUCTION
)

EVAL_TEMPLATE = "{problem}\n\n" + BOXED_INSTRUCTION

# The branch-viability diagnostic's privileged-answer teacher (paper Appendix A; it appears only in
# the paper, one line per displayed line). "{{answer}}" in the paper's display is read as the answer
# inside \boxed{...}; see docs/decisions.md.
DIAGNOSTIC_TEACHER_TEMPLATE = (
    "You are a privileged teacher. Solve the problem and end your solution with the correct boxed answer.\n"
    "Problem: {problem}\n"
    "Privileged ground-truth final answer: {answer}\n"
    "Use the ground-truth answer above. Produce a complete step-by-step solution that ends with \\boxed{{answer}}."
)

# An unclosed <think> at the very end of a rendered prompt.
OPEN_THINK_AT_END = re.compile(r"<think\s*>\s*$")
THINK_CLOSURE = "</think>\n\n"


def fixed_phrases(min_chars: int = 8) -> list[str]:
    """The constant text between the placeholders of the training and evaluation templates (at
    least ``min_chars`` long), longest first: what a tokenizer may encode as single tokens (the tiny
    model's does). The diagnostic's teacher template is left out: a model pretrained without it
    would meet untrained tokens there, where word pieces carry what it learned."""
    pieces = set()
    for template in (STUDENT_TRAIN_TEMPLATE, TEACHER_TRAIN_TEMPLATE, EVAL_TEMPLATE):
        pieces.update(p for p in re.split(r"\{(?:problem|solution|answer)\}", template) if len(p) >= min_chars)
    return sorted(pieces, key=lambda p: (-len(p), p))


def student_message(problem: str) -> str:
    return STUDENT_TRAIN_TEMPLATE.replace("{problem}", problem)


# The privileged template without its transition paragraph (training.teacher_transition: false): the
# reference solution, then the boxed instruction. Beyond the paper, for small models: SmolLM2-135M
# continues the transition's "explore different approaches" by rambling, and from the paper's
# template boxes a right answer less often than from the student's own prompt (docs/rehearsal.md).
TEACHER_PLAIN_TEMPLATE = TEACHER_TRAIN_TEMPLATE.replace(TEACHER_TRANSITION + "\n", "\n")


def teacher_message(problem: str, solution: str, *, transition: bool = True) -> str:
    template = TEACHER_TRAIN_TEMPLATE if transition else TEACHER_PLAIN_TEMPLATE
    # Substitute the solution first so that a "{problem}" inside a solution text stays literal.
    return template.replace("{solution}", solution).replace("{problem}", problem, 1)


def diagnostic_teacher_message(problem: str, answer: str) -> str:
    # The answer first, so that a "{problem}" inside an answer stays literal; then the one problem slot.
    return DIAGNOSTIC_TEACHER_TEMPLATE.replace("{answer}", answer).replace("{problem}", problem, 1)


def eval_message(problem: str) -> str:
    return EVAL_TEMPLATE.replace("{problem}", problem)


def apply_think_closure(rendered: str) -> str:
    """Append ``</think>\\n\\n`` when a rendered prompt ends in an open ``<think>`` tag."""
    if OPEN_THINK_AT_END.search(rendered):
        return rendered + THINK_CLOSURE
    return rendered


@dataclass(frozen=True)
class PromptStyle:
    """How one kind of prompt is rendered through a model's chat template."""

    name: str
    enable_thinking: bool
    think_closure: bool


STUDENT = PromptStyle("student", enable_thinking=False, think_closure=True)
TEACHER = PromptStyle("teacher", enable_thinking=True, think_closure=False)
EVAL = PromptStyle("eval", enable_thinking=True, think_closure=False)
PROMPT_STYLES = {s.name: s for s in (STUDENT, TEACHER, EVAL)}


def render(tokenizer, user_message: str, style: PromptStyle, *, think_closure: bool = True) -> str:
    """Render one user turn with the tokenizer's chat template, generation prompt appended.

    ``think_closure`` is the model entry's switch (``chat_template.think_closure``); it only has
    an effect for styles that use the closure (the student style).
    """
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": user_message}],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=style.enable_thinking,
    )
    if style.think_closure and think_closure:
        text = apply_think_closure(text)
    return text


def encode(tokenizer, rendered: str, *, add_special_tokens: bool) -> list[int]:
    """Token ids of a rendered prompt (``add_special_tokens`` per model entry; the reference
    implementation tokenizes with the default ``True``, which doubles the BOS on Llama)."""
    return list(tokenizer(rendered, add_special_tokens=add_special_tokens)["input_ids"])


def prompt_ids(tokenizer, user_message: str, style: PromptStyle, *, think_closure: bool = True,
               add_special_tokens: bool = True) -> list[int]:
    """Token ids of one rendered user turn (:func:`render` then :func:`encode`); ``think_closure``
    and ``add_special_tokens`` are the model entry's ``chat_template`` switches."""
    return encode(tokenizer, render(tokenizer, user_message, style, think_closure=think_closure),
                  add_special_tokens=add_special_tokens)
