"""Turns a generation into reasoning and content, exactly as the model produced them.

- `/v1/chat/completions`: the server split them already.
- `/generate` with the model's tokenizer at hand: decode `output_ids` with special tokens kept and
  split that, so the result does not depend on the server's `skip_special_tokens`.
- `/generate` without it: split the text, which is why requests ask `skip_special_tokens: false`.
End-of-sequence style tokens left in the text are stripped; reasoning markers never reach it.
"""
from __future__ import annotations

from typing import Any, Mapping

from common.reasoning import ReasoningSplit, split_reasoning
from workers.sglang_client import Generation

# Tokens that end a turn or a sequence; they carry no text of the model's.
TURN_END_TOKENS = ("<|im_end|>", "[EOS]", "[EOT]", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>",
                   "<｜end▁of▁sentence｜>", "<|return|>", "</s>")


class CompletionSplitter:
    def __init__(self, parser: str, tokenizer: Any | None = None) -> None:
        self.parser = parser
        self.tokenizer = tokenizer
        strip = set(TURN_END_TOKENS)
        if tokenizer is not None:
            strip |= {t for t in (tokenizer.eos_token, tokenizer.bos_token, tokenizer.pad_token) if t}
        self._strip = tuple(sorted(strip, key=len, reverse=True))

    def split(self, generation: Generation, chat_template_kwargs: Mapping[str, Any] | None) -> ReasoningSplit:
        if generation.reasoning is not None or generation.content is not None:
            return ReasoningSplit(generation.reasoning or "", generation.content or "",
                                  closed=bool(generation.content))
        text = generation.text
        if self.tokenizer is not None and generation.output_ids:
            text = self.tokenizer.decode(generation.output_ids, skip_special_tokens=False)
        split = split_reasoning(text, self.parser, chat_template_kwargs)
        return ReasoningSplit(self._clean(split.reasoning), self._clean(split.content), split.closed)

    def _clean(self, text: str) -> str:
        for token in self._strip:
            if token in text:
                text = text.replace(token, "")
        return text
