"""A byte-level BPE tokenizer with a Qwen3-style chat template, built with ``tokenizers``.

Special tokens follow Qwen3: ``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>`` (eos) as
special tokens and ``<think>``/``</think>`` as added non-special tokens (they stay in decoded
text, as with Qwen3). Digits are split individually so that numbers are digit sequences.
"""

from __future__ import annotations

from typing import Iterable

PAD, IM_START, IM_END, THINK, END_THINK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"

# The Qwen3 template's behaviour for one user turn plus an assistant turn, simplified to what this
# project uses: enable_thinking=False appends an empty think block to the generation prompt; an
# assistant message in the history is rendered as given.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)


def build_tokenizer(corpus: Iterable[str], vocab_size: int, phrases: Iterable[str] = ()):
    """Train a byte-level BPE on ``corpus`` and wrap it as a transformers fast tokenizer.

    Each of ``phrases`` (the prompt templates' constant sentences, :func:`pwopsd.prompts.fixed_phrases`)
    becomes one added token, as a real model's large vocabulary compresses common English: the long
    privileged-teacher instruction is then a few tokens instead of ~120 byte-level word pieces,
    which makes every pass over teacher prompts (pretraining, training, the diagnostic) ~2x
    cheaper; response text is tokenized by the BPE alone."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    from tokenizers import AddedToken

    tok.add_tokens([AddedToken(THINK, special=False, normalized=False), AddedToken(END_THINK, special=False, normalized=False)])
    tok.add_tokens([AddedToken(p, special=False, normalized=False) for p in phrases])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD,
        padding_side="left",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast
