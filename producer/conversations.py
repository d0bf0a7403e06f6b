"""Normalises a dataset row to OpenAI chat messages and cuts it to the prompt to generate from.

Accepted shapes: OpenAI `messages`, ShareGPT `conversations` (`from`/`value` or `role`/`content`),
a plain `prompt` string.
"""
from __future__ import annotations

from typing import Any

Message = dict[str, Any]

SHAREGPT_ROLES = {
    "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
    "chatgpt": "assistant", "bing": "assistant", "bard": "assistant", "model": "assistant",
    "system": "system", "tool": "tool", "function": "tool", "observation": "tool",
    "function_call": "assistant",
}


class RowRejected(ValueError):
    """The row cannot become a prompt; the message says why."""


def to_messages(data: dict[str, Any]) -> list[Message]:
    if "messages" in data:
        return _openai_messages(data["messages"])
    if "conversations" in data:
        return _sharegpt_messages(data["conversations"])
    if isinstance(data.get("prompt"), str):
        return [{"role": "user", "content": data["prompt"]}]
    raise RowRejected("no 'messages', 'conversations' or 'prompt' field")


def prompt_messages(messages: list[Message]) -> list[Message]:
    """The conversation up to its last user turn: the assistant reply after it is regenerated."""
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last_user is None:
        raise RowRejected("no user turn")
    return messages[: last_user + 1]


def _openai_messages(raw: Any) -> list[Message]:
    if not isinstance(raw, list) or not raw:
        raise RowRejected("'messages' must be a non-empty list")
    messages = []
    for index, message in enumerate(raw):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RowRejected(f"messages[{index}] has no 'role'")
        content = message.get("content")
        if content is None and message["role"] == "assistant":
            content = ""
        if not isinstance(content, str):
            raise RowRejected(f"messages[{index}] content must be a string")
        messages.append({**message, "content": content})
    return messages


def _sharegpt_messages(raw: Any) -> list[Message]:
    if not isinstance(raw, list) or not raw:
        raise RowRejected("'conversations' must be a non-empty list")
    messages = []
    for index, turn in enumerate(raw):
        if not isinstance(turn, dict):
            raise RowRejected(f"conversations[{index}] is not an object")
        speaker = turn.get("from", turn.get("role"))
        text = turn.get("value", turn.get("content"))
        role = SHAREGPT_ROLES.get(str(speaker).lower())
        if role is None:
            raise RowRejected(f"conversations[{index}] has unknown speaker {speaker!r}")
        if not isinstance(text, str):
            raise RowRejected(f"conversations[{index}] has no text")
        messages.append({"role": role, "content": text})
    return messages
