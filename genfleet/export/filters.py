"""Which records an export leaves out, and why (counted per reason in the manifest).

With `--regenerate all` a record is judged on every generated turn: one truncated turn, one turn
without reasoning or with too little content fails the whole conversation, because a trainer
reads it as one sample.
"""
from __future__ import annotations

from dataclasses import dataclass

from genfleet.export.conversation import Record, generated_turns

TRUNCATED = "truncated"
NO_REASONING = "no_reasoning"
SHORT_CONTENT = "short_content"


@dataclass(frozen=True)
class RecordFilters:
    drop_truncated: bool = False  # finish_reason "length": cut at max_new_tokens
    require_reasoning: bool = False  # non-blank reasoning
    min_content_chars: int = 0  # content, stripped of surrounding whitespace

    def rejection(self, record: Record) -> str | None:
        """The first reason to leave the record out, or None to keep it."""
        if not (self.drop_truncated or self.require_reasoning or self.min_content_chars):
            return None
        turns = generated_turns(record)
        if self.drop_truncated and any(turn.finish_reason == "length" for turn in turns):
            return TRUNCATED
        if self.require_reasoning and any(not turn.reasoning.strip() for turn in turns):
            return NO_REASONING
        if self.min_content_chars and any(len(turn.content.strip()) < self.min_content_chars for turn in turns):
            return SHORT_CONTENT
        return None
