"""Which records an export leaves out, and why (counted per reason in the manifest).

With `--regenerate all` a record is judged on every generated turn: one truncated or looped turn,
one turn without reasoning or with too little content fails the whole conversation, because a
trainer reads it as one sample. Samples (`--samples N`) are judged one by one: a prompt keeps the
samples that pass.
"""
from __future__ import annotations

from dataclasses import dataclass

from genfleet.export.conversation import Record, generated_turns

TRUNCATED = "truncated"
LOOPED = "looped"
NO_REASONING = "no_reasoning"
SHORT_CONTENT = "short_content"


def looped(record: Record) -> bool:
    """The loop guard stopped or flagged a degenerate repetition (finish_reason "loop"): such text
    teaches a model to repeat itself."""
    if record.get("loop") is not None or record.get("finish_reason") == "loop":
        return True
    return any(turn.finish_reason == "loop" for turn in generated_turns(record))


@dataclass(frozen=True)
class RecordFilters:
    drop_truncated: bool = False  # finish_reason "length": cut at max_new_tokens
    require_reasoning: bool = False  # non-blank reasoning
    min_content_chars: int = 0  # content, stripped of surrounding whitespace
    drop_looped: bool = False  # finish_reason "loop": the loop guard's finding

    def rejection(self, record: Record) -> str | None:
        """The first reason to leave the record out, or None to keep it."""
        if not (self.drop_truncated or self.drop_looped or self.require_reasoning or self.min_content_chars):
            return None
        turns = generated_turns(record)
        if self.drop_truncated and any(turn.finish_reason == "length" for turn in turns):
            return TRUNCATED
        if self.drop_looped and looped(record):
            return LOOPED
        if self.require_reasoning and any(not turn.reasoning.strip() for turn in turns):
            return NO_REASONING
        if self.min_content_chars and any(len(turn.content.strip()) < self.min_content_chars for turn in turns):
            return SHORT_CONTENT
        return None
