"""Synthetic multi-step integer-arithmetic problems with step-by-step solutions.

A level-``L`` problem chains ``L`` additions/subtractions, e.g. ``Compute 12 + 7 - 3.`` Its
worked solution writes one line per step and ends with ``\\boxed{N}``. The *reference solution*
(what the privileged teacher prompt quotes, like the OPSD corpus' ``solution`` column) is either
the worked solution (default, as the OPSD corpus quotes full solutions) or the answer alone.

Everything is a pure function of a seed (``numpy.random.default_rng``), so rules regenerate the
same data on every machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ArithmeticProblem:
    operands: tuple[int, ...]
    ops: tuple[str, ...]  # "+" or "-", len(operands) - 1

    @property
    def level(self) -> int:
        return len(self.ops)

    @property
    def answer(self) -> int:
        value = self.operands[0]
        for op, x in zip(self.ops, self.operands[1:]):
            value = value + x if op == "+" else value - x
        return value

    @property
    def problem(self) -> str:
        expr = str(self.operands[0])
        for op, x in zip(self.ops, self.operands[1:]):
            expr += f" {op} {x}"
        return f"Compute {expr}."

    def steps(self) -> list[str]:
        lines, value = [], self.operands[0]
        for op, x in zip(self.ops, self.operands[1:]):
            new = value + x if op == "+" else value - x
            lines.append(f"{value} {op} {x} = {new}")
            value = new
        return lines

    @property
    def worked_solution(self) -> str:
        """Step-by-step solution ending in the boxed answer (the model's target response)."""
        return "\n".join(self.steps()) + f"\nThe answer is \\boxed{{{self.answer}}}."

    @property
    def answer_statement(self) -> str:
        return f"The answer is {self.answer}."

    @property
    def numbered_solution(self) -> str:
        """The worked solution laid out as SmolLM2-135M-Instruct lays out its own greedy answers
        (numbered steps, a blank line, "So, the answer is ..."): a pretrained model copies a
        solution in its own layout more readily (docs/rehearsal.md, "Does it learn?")."""
        steps = "\n".join(f"{i}. {line}" for i, line in enumerate(self.steps(), 1))
        return f"{steps}\n\nSo, the answer is \\boxed{{{self.answer}}}."

    def reference_solution(self, style: str = "worked") -> str:
        """What the privileged teacher prompt quotes: the worked solution (``worked``; ``numbered``:
        in a pretrained model's own layout) or the answer alone."""
        if style == "worked":
            return self.worked_solution
        if style == "numbered":
            return self.numbered_solution
        if style == "answer":
            return self.answer_statement
        raise ValueError(f"reference solution style must be 'worked', 'numbered' or 'answer', got {style!r}")


def sample_problem(rng: np.random.Generator, level: int, max_operand: int, max_value: int | None = None) -> ArithmeticProblem:
    """One level-``level`` problem with operands in ``1..max_operand``. With ``max_value``, every
    value of the chain (the first operand and each step's result) stays in ``0..max_value``: a
    step adds only what keeps it at most ``max_value`` and subtracts only what keeps it at least 0
    (the operation is drawn among those that can), so the steps use a small table of facts."""
    if max_value is None:
        operands = tuple(int(x) for x in rng.integers(1, max_operand + 1, size=level + 1))
        ops = tuple("+" if b else "-" for b in rng.integers(0, 2, size=level))
        return ArithmeticProblem(operands, ops)
    value = int(rng.integers(1, min(max_operand, max_value) + 1))
    operands, ops = [value], []
    for _ in range(level):
        possible = [op for op, ok in (("+", value < max_value), ("-", value > 0)) if ok]
        op = possible[int(rng.integers(0, len(possible)))]
        x = int(rng.integers(1, min(max_operand, max_value - value if op == "+" else value) + 1))
        value = value + x if op == "+" else value - x
        operands.append(x)
        ops.append(op)
    return ArithmeticProblem(tuple(operands), tuple(ops))


def sample_problems(seed: int, n: int, levels: list[int], max_operand: int, max_value: int | None = None,
                    exclude: frozenset[ArithmeticProblem] = frozenset(), distinct: bool = False) -> list[ArithmeticProblem]:
    """``n`` problems with levels cycled in equal shares, deterministically from ``seed``; a problem
    in ``exclude`` (a held-out set) is drawn again (without it, the stream is the same), and with
    ``distinct`` so is one already drawn (a benchmark: a repeated problem would get the same samples
    as its first copy, and count twice in every per-problem statistic)."""
    rng = np.random.default_rng(seed)
    out: list[ArithmeticProblem] = []
    drawn: set[ArithmeticProblem] = set()
    for _ in range(100 * n):
        if len(out) == n:
            break
        problem = sample_problem(rng, levels[len(out) % len(levels)], max_operand, max_value)
        if problem not in exclude and not (distinct and problem in drawn):
            out.append(problem)
            drawn.add(problem)
    if len(out) < n:
        raise ValueError(f"only {len(out)} of {n} {'distinct ' if distinct else ''}problems found outside the {len(exclude)} held out "
                         f"(levels {levels}, max_operand {max_operand}): too few distinct problems")
    return out


# The worked example of a one-shot problem (``example=True``), a fixed problem of level 1.
EXAMPLE = ArithmeticProblem((2, 3), ("+",))


def one_shot(problem: ArithmeticProblem) -> str:
    """The problem text after one worked example (:data:`EXAMPLE`): for a pretrained model that does
    not box its answers unprompted (config/rehearsal.yaml); the prompt template is unchanged."""
    return f"Example: {EXAMPLE.problem}\nSolution: {EXAMPLE.worked_solution}\n\nNow c{problem.problem[1:]}"


def problems_frame(problems: list[ArithmeticProblem], id_prefix: str, solution_style: str = "worked",
                   example: bool = False):
    """A benchmark/corpus table: ``id, problem, answer, solution, level`` (``example``: each problem
    text is :func:`one_shot`)."""
    import pandas as pd

    return pd.DataFrame(
        {
            "id": [f"{id_prefix}-{i}" for i in range(len(problems))],
            "problem": [one_shot(p) if example else p.problem for p in problems],
            "answer": [str(p.answer) for p in problems],
            "solution": [p.reference_solution(solution_style) for p in problems],
            "level": [p.level for p in problems],
        }
    )
