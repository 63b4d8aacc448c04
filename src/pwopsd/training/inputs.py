"""What one training run is fed: its settings (:class:`TrainConfig`), its examples, their seeded
order and rollout seeds, the teacher's prompt of each, and the assembled ``[prompt | completion]``
batches the student and the teacher see."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from pwopsd import prompts

@dataclass
class TrainConfig:
    """The settings of one training run, built from the validated config by
    :func:`pwopsd.config.training_config` (rule ``train``). No field has a default here: the
    config schema is the one place defaults live (``config.schema_defaults("training")``)."""

    method: str  # loss: opsd | pwopsd | eopd | reopold
    loss: dict[str, Any]  # the loss's parameters (methods.<name>.params, schema defaults filled)
    temperature: float  # distillation temperature (= rollout temperature, as in the reference)
    clip: float
    opsd_upcast: bool  # the reference OPSD computes its loss in the model dtype (bf16 on GPU)
    lora_r: int
    lora_alpha: int
    lora_dropout: float  # paper says 0.05; the reference's GOLDConfig zeroes it (effective 0)
    lora_targets: list[str]
    lr: float
    max_steps: int  # the schedule's length: the learning rate decays linearly to 0 over it
    stop_at: int  # training stops after this step (<= max_steps; not part of the run key)
    save_every: int
    grad_clip: float
    per_device_batch_size: int
    gradient_accumulation_steps: int
    seed: int
    rollout_top_p: float
    rollout_top_k: int
    max_completion_length: int
    chunk_size: int
    rollout_batch_size: int
    position_ids: str  # reference (prompt-PAD gap kept) | contiguous
    gradient_checkpointing: bool  # the reference launchers' setting; memory only, values unchanged
    rollout_backend: str  # hf (the live model) | vllm (a colocated engine synced every step)
    rollout_engine: dict  # the vLLM rollout engine's settings ({} for hf)
    rollout_policy: str  # adapter (base + current LoRA, exactly on-policy) | merged_bf16 (the reference's)
    deterministic: bool  # deterministic GPU kernels (set_determinism); part of the run key: it changes GPU numerics
    # privileged (the paper) | no_solution | student: ablations (teacher_message_for). The one field
    # with a default: the config emits it only for an ablation, so the paper's runs keep their
    # params and run keys (adding it reran and restarted nothing).
    teacher_prompt: str = "privileged"
    # training.teacher_transition: false leaves the paper template's transition paragraph out (beyond
    # the paper, for small models). Emitted only when false, so the paper's run keys stay as they were.
    teacher_transition: bool = True

    @property
    def last_step(self) -> int:
        """The step training stops after."""
        return min(self.stop_at, self.max_steps)

    @property
    def rank_batch(self) -> int:
        """Problems per optimizer step on one process."""
        return self.per_device_batch_size * self.gradient_accumulation_steps


TEACHER_PROMPTS = ("privileged", "no_solution", "student")


def teacher_message_for(example, teacher_prompt: str, *, transition: bool = True) -> str:
    """The teacher's user message of a training example (``methods.<m>.teacher_prompt``):
    ``privileged``, the paper's, quotes the reference solution; ``no_solution`` is the same template
    with the solution left empty (the teacher knows nothing the student does not); ``student``
    (handled by the trainer) is the student's own prompt, so teacher = student. The last two are
    ablations: without the privileged solution, self-distillation has nothing to teach.
    ``transition``: the paper template's transition paragraph (``training.teacher_transition``)."""
    if teacher_prompt == "privileged":
        return prompts.teacher_message(example.problem, example.solution, transition=transition)
    if teacher_prompt == "no_solution":
        return prompts.teacher_message(example.problem, "", transition=transition)
    raise ValueError(f"teacher_prompt must be one of {', '.join(TEACHER_PROMPTS)}; got {teacher_prompt!r}")


@dataclass
class Example:
    problem: str
    solution: str
    answer: str


def data_order(n: int, seed: int, epochs: int) -> np.ndarray:
    """Indices of the training problems in order: a fresh seeded permutation per epoch."""
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.permutation(n) for _ in range(epochs)])


def rollout_seed(seed: int, step: int, index: int) -> int:
    return int(np.random.SeedSequence([seed, step, index]).generate_state(1)[0])


def assemble(prompt_ids: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_id: int, *,
             position_mode: str = "reference") -> dict[str, torch.Tensor]:
    """Sequences ``[prompt | PAD to P | completion | PAD to Tc]`` with the reference's masks.

    Returns ``input_ids``, ``attention_mask`` (id != pad), ``position_ids``, ``prompt_width`` P,
    ``completion`` ids ``[B, Tc]`` and the loss ``mask`` ``[B, Tc]`` (completion id != pad).
    """
    P = max(len(p) for p in prompt_ids)
    Tc = max(1, max(len(c) for c in completions))
    rows = []
    for p, c in zip(prompt_ids, completions):
        rows.append(list(p) + [pad_id] * (P - len(p)) + list(c) + [pad_id] * (Tc - len(c)))
    ids = torch.tensor(rows, dtype=torch.long)
    attn = (ids != pad_id).long()
    if position_mode == "reference":
        pos = torch.arange(ids.shape[1]).expand_as(ids).clone()
    elif position_mode == "contiguous":
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
    else:
        raise ValueError(f"position_ids must be 'reference' or 'contiguous', got {position_mode!r}")
    completion = ids[:, P:]
    return {"input_ids": ids, "attention_mask": attn, "position_ids": pos, "prompt_width": torch.tensor(P),
            "completion": completion, "mask": (completion != pad_id).float()}


class PromptIds(Sequence):
    """The token ids of every example's rendered prompt, rendered when first asked for: a run sees
    ``effective_batch x max_steps`` examples, often a fraction of the corpus."""

    def __init__(self, render, examples: Sequence[Example]):
        self._render, self._examples, self._ids = render, examples, {}

    def __len__(self) -> int:
        return len(self._examples)

    def __getitem__(self, i: int) -> list[int]:
        if i not in self._ids:
            self._ids[i] = self._render(self._examples[i])
        return self._ids[i]
