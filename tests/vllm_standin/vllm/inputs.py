"""Stand-in for ``vllm.inputs`` (see the package docstring)."""


def TokensPrompt(*, prompt_token_ids):  # noqa: N802 - a TypedDict constructor in vLLM
    return {"prompt_token_ids": list(prompt_token_ids)}
