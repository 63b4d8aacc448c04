"""Answer extraction (and, with the evaluation slice, grading).

``extract_boxed`` follows the reference implementation (``evaluate_math.py``): take the *last*
occurrence of ``\\boxed`` anywhere in the text (thinking part included), match braces forward
from it, and keep the result only if the span starts with ``\\boxed{`` and its braces balance.
``\\boxed 5``, a truncated ``\\boxed{`` and ``\\fbox{..}`` give ``None`` (unformatted). If the last
``\\boxed`` is malformed, no earlier one is tried.
"""

from __future__ import annotations

BOXED = "\\boxed"


def extract_boxed(text: str | None) -> str | None:
    if not text:
        return None
    start = text.rfind(BOXED)
    if start < 0:
        return None
    i = start + len(BOXED)
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        c = text[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j].strip()
    return None


def integer_answer(text: str | None) -> int | None:
    """The boxed answer as an integer, or None (used by the tiny model's build check only)."""
    inner = extract_boxed(text)
    if inner is None:
        return None
    try:
        return int(inner.replace(" ", ""))
    except ValueError:
        return None
