"""The conversation every export format starts from: a completion record's prompt messages with the
generated assistant turn(s) put back where they were generated.

With `--regenerate all` the record's `messages` already hold the model's earlier replies (content
only, as the model saw them), and `turns` holds each reply's reasoning too.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]
Record = dict[str, Any]


class FormatError(ValueError):
    """A record this format cannot express; the message names the record."""


@dataclass(frozen=True)
class GeneratedTurn:
    reasoning: str
    content: str
    finish_reason: str
    matched_stop: int | str | list[int] | None
    output_ids: list[int] | None

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    def message(self) -> Message:
        message: Message = {"role": "assistant", "content": self.content}
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        return message


@dataclass(frozen=True)
class Conversation:
    id: str
    dataset: str
    messages: list[Message]  # prompt and generated turns, in order
    generated: tuple[int, ...]  # indices in `messages` of the generated assistant turns
    turns: tuple[GeneratedTurn, ...]  # the generated turns, in the same order


def generated_turns(record: Record) -> tuple[GeneratedTurn, ...]:
    if record.get("turns"):
        return tuple(GeneratedTurn(t["reasoning"], t["content"], t["finish_reason"], t.get("matched_stop"),
                                   t.get("output_ids")) for t in record["turns"])
    return (GeneratedTurn(record["reasoning"], record["content"], record["finish_reason"],
                          record.get("matched_stop"), record.get("output_ids")),)


def conversation_of(record: Record) -> Conversation:
    turns = generated_turns(record)
    messages = [dict(message) for message in record["messages"]]
    # The model's earlier replies sit in the prompt where it made them: every assistant turn after
    # the first user turn (workers/generation/replies.py `reply_positions`).
    earlier: list[int] = []
    seen_user = False
    for index, message in enumerate(messages if len(turns) > 1 else ()):
        seen_user = seen_user or message.get("role") == "user"
        if message.get("role") == "assistant" and seen_user:
            earlier.append(index)
    if len(earlier) != len(turns) - 1:
        raise FormatError(f"{record['id']}: {len(turns)} generated turns, but the prompt holds "
                          f"{len(earlier)} earlier replies")
    for index, turn in zip(earlier, turns, strict=False):
        messages[index] = turn.message()
    messages.append(turns[-1].message())
    return Conversation(record["id"], record["dataset"], messages, (*earlier, len(messages) - 1), turns)
