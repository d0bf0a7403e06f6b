"""Which assistant turns of a conversation to generate, and the prompt for each.

`last` (default): the producer already cut the conversation after its last user turn; one reply.
`all` (SpecForge's on-policy mode): every assistant turn in order, each conditioned on the model's
own earlier replies. Earlier replies enter the history as content only; the chat template decides
how past turns look (most drop past reasoning).
"""
from __future__ import annotations

from typing import Any

Message = dict[str, Any]
REGENERATE_MODES = ("last", "all")


def reply_positions(messages: list[Message], mode: str) -> list[int]:
    """Indices where the model speaks; `len(messages)` means a reply appended at the end."""
    if mode == "last":
        return [len(messages)]
    positions = []
    seen_user = False
    for index, message in enumerate(messages):
        seen_user = seen_user or message["role"] == "user"
        if message["role"] == "assistant" and seen_user:
            positions.append(index)
    if messages and messages[-1]["role"] in ("user", "tool"):
        positions.append(len(messages))
    return positions


def history_before(messages: list[Message], position: int, replies: dict[int, Message]) -> list[Message]:
    """The prompt for the reply at `position`: earlier assistant turns replaced by the model's own."""
    return [replies.get(index, message) for index, message in enumerate(messages[:position])]
