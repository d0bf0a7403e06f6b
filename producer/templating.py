"""Applies the model's chat template and counts prompt tokens, a batch at a time (fast tokenizer)."""
from __future__ import annotations

from typing import Any

from genfleet.common.tokenizer import load_tokenizer, render_prompts

Message = dict[str, Any]


class PromptTemplater:
    def __init__(self, tokenizer_dir: str, chat_template_kwargs: dict[str, Any] | None = None) -> None:
        self.tokenizer_dir = tokenizer_dir
        self.tokenizer = load_tokenizer(tokenizer_dir)
        self.chat_template_kwargs = chat_template_kwargs or {}
        # The Rust tokenizer behind a fast tokenizer: its batch encode runs on every core and
        # `encode_batch_fast` skips the offsets nobody here reads.
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        self._encode = getattr(backend, "encode_batch_fast", None) or getattr(backend, "encode_batch", None)

    @property
    def context_length(self) -> int | None:
        """The tokenizer's `model_max_length`, unless it is transformers' "unset" sentinel."""
        value = getattr(self.tokenizer, "model_max_length", None)
        return value if isinstance(value, int) and value < 10**8 else None

    def render(self, conversations: list[list[Message]],
               chat_template_kwargs: dict[str, Any] | None = None) -> list[list[int]]:
        """Token ids of each conversation's prompt, generation prompt included."""
        if not conversations:
            return []
        kwargs = self.chat_template_kwargs if chat_template_kwargs is None else chat_template_kwargs
        if self._encode is None:
            return render_prompts(self.tokenizer, conversations, kwargs)
        texts = self.tokenizer.apply_chat_template(conversations, tokenize=False, add_generation_prompt=True,
                                                   **kwargs)
        # The template holds every special token it wants: add none (no double BOS).
        return [encoding.ids for encoding in self._encode(texts, add_special_tokens=False)]
