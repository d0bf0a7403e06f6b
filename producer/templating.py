"""Applies the model's chat template and counts prompt tokens, a batch at a time (fast tokenizer)."""
from __future__ import annotations

from typing import Any

from common.tokenizer import load_tokenizer, render_prompts

Message = dict[str, Any]


class PromptTemplater:
    def __init__(self, tokenizer_dir: str, chat_template_kwargs: dict[str, Any] | None = None) -> None:
        self.tokenizer_dir = tokenizer_dir
        self.tokenizer = load_tokenizer(tokenizer_dir)
        self.chat_template_kwargs = chat_template_kwargs or {}

    def render(self, conversations: list[list[Message]]) -> list[list[int]]:
        return render_prompts(self.tokenizer, conversations, self.chat_template_kwargs)
