"""Loads a model's tokenizer from a local directory, the same way for a real model and the sim's."""
from __future__ import annotations

import os
from pathlib import Path

from genfleet.common import GenfleetError

# transformers warns at import that PyTorch is missing; genfleet only needs tokenizers.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


class TokenizerNotFoundError(GenfleetError, FileNotFoundError):
    pass


def load_tokenizer(path: str | Path):
    """A `transformers` fast tokenizer with its chat template; never touches the hub."""
    from transformers import AutoTokenizer

    directory = Path(path)
    if not (directory / "tokenizer_config.json").is_file() and not (directory / "tokenizer.json").is_file():
        raise TokenizerNotFoundError(
            f"{directory} is not a tokenizer directory (no tokenizer.json / tokenizer_config.json); "
            "pass the local model directory, genfleet never downloads from a hub"
        )
    tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    if not getattr(tokenizer, "chat_template", None):
        raise TokenizerNotFoundError(f"{directory} has no chat template (tokenizer_config.json: chat_template)")
    return tokenizer


def render_prompts(tokenizer, conversations: list[list[dict]], chat_template_kwargs: dict | None = None,
                   ) -> list[list[int]]:
    """Token ids of each conversation's prompt, generation prompt included. The template already
    holds the special tokens it wants, so none are added a second time (no double BOS)."""
    texts = tokenizer.apply_chat_template(conversations, tokenize=False, add_generation_prompt=True,
                                          **(chat_template_kwargs or {}))
    return tokenizer(texts, add_special_tokens=False)["input_ids"]
