"""Applies the model's chat template and counts prompt tokens, a batch at a time (fast tokenizer)."""
from __future__ import annotations

from typing import Any

from common.tokenizer import load_tokenizer

Message = dict[str, Any]


class PromptTemplater:
    def __init__(self, tokenizer_dir: str, chat_template_kwargs: dict[str, Any] | None = None) -> None:
        self.tokenizer = load_tokenizer(tokenizer_dir)
        self.chat_template_kwargs = chat_template_kwargs or {}

    def render(self, conversations: list[list[Message]]) -> list[list[int]]:
        """Token ids of each prompt, generation prompt included. The template already holds the
        special tokens it wants, so none are added a second time (no double BOS)."""
        texts = self.tokenizer.apply_chat_template(
            conversations, tokenize=False, add_generation_prompt=True, **self.chat_template_kwargs,
        )
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"]
