"""Normalises a dataset row to OpenAI chat messages and cuts it to the prompt to generate from.

Row formats: OpenAI `messages`; ShareGPT `conversations` (`from`/`value` or `role`/`content`); a plain
prompt string (field `prompt` unless told otherwise); an OpenAI Batch request line (`custom_id`,
`body.messages`, `body.max_tokens`). `auto` picks by the fields present, in that order of checks.
"""
from __future__ import annotations

from typing import Any, Literal, NamedTuple, get_args

Message = dict[str, Any]
RowFormat = Literal["auto", "messages", "sharegpt", "prompt", "openai_batch"]
ROW_FORMATS: tuple[str, ...] = get_args(RowFormat)

SHAREGPT_ROLES = {
    "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
    "chatgpt": "assistant", "bing": "assistant", "bard": "assistant", "model": "assistant",
    "system": "system", "tool": "tool", "function": "tool", "observation": "tool",
    "function_call": "assistant",
}


class RowRejected(ValueError):
    """The row cannot become a prompt; the message says why."""


class RowPrompt(NamedTuple):
    messages: list[Message]
    # The row's own cap on new tokens (OpenAI Batch `max_tokens`), None when it has none.
    max_tokens: int | None = None


def to_messages(data: dict[str, Any]) -> list[Message]:
    """The row's conversation, whatever its (auto-detected) format."""
    return read_row(data).messages


def read_row(data: dict[str, Any], row_format: str = "auto", prompt_field: str = "prompt") -> RowPrompt:
    if row_format == "auto":
        row_format = _detect(data, prompt_field)
    if row_format == "messages":
        return RowPrompt(_openai_messages(_field(data, "messages")))
    if row_format == "sharegpt":
        return RowPrompt(_sharegpt_messages(_field(data, "conversations")))
    if row_format == "prompt":
        prompt = _field(data, prompt_field)
        if not isinstance(prompt, str):
            raise RowRejected(f"'{prompt_field}' must be a string, got {type(prompt).__name__}")
        return RowPrompt([{"role": "user", "content": prompt}])
    if row_format == "openai_batch":
        return _batch_request(data)
    raise ValueError(f"unknown row format {row_format!r} (one of {', '.join(ROW_FORMATS)})")


def prompt_messages(messages: list[Message]) -> list[Message]:
    """The conversation up to its last user turn: the assistant reply after it is regenerated."""
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last_user is None:
        raise RowRejected("no user turn")
    return messages[: last_user + 1]


def _detect(data: dict[str, Any], prompt_field: str) -> str:
    if "messages" in data:
        return "messages"
    if "conversations" in data:
        return "sharegpt"
    if isinstance(data.get("body"), dict):
        return "openai_batch"
    if prompt_field in data:
        return "prompt"
    raise RowRejected(f"no 'messages', 'conversations', 'body' or '{prompt_field}' field")


def _field(data: dict[str, Any], name: str) -> Any:
    if name not in data:
        raise RowRejected(f"no '{name}' field")
    return data[name]


def _batch_request(data: dict[str, Any]) -> RowPrompt:
    body = data.get("body")
    if not isinstance(body, dict):
        raise RowRejected("OpenAI batch line without a 'body' object")
    messages = _openai_messages(_field(body, "messages"))
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                                   or max_tokens < 1):
        raise RowRejected(f"body.max_tokens must be a positive integer, got {max_tokens!r}")
    return RowPrompt(messages, max_tokens)


def _openai_messages(raw: Any) -> list[Message]:
    if not isinstance(raw, list) or not raw:
        raise RowRejected("'messages' must be a non-empty list")
    messages = []
    for index, message in enumerate(raw):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RowRejected(f"messages[{index}] has no 'role'")
        content = message.get("content")
        if content is None and message["role"] == "assistant":
            content = ""  # a tool-calling turn
        if not isinstance(content, str):
            raise RowRejected(f"messages[{index}] content must be a string, got {type(content).__name__}")
        if content is not message.get("content") or None in message.values():
            # Columnar sources give every message every field of the column's schema, mostly None.
            message = {key: value for key, value in message.items() if value is not None}
            message["content"] = content
        messages.append(message)
    return messages


def _sharegpt_messages(raw: Any) -> list[Message]:
    if not isinstance(raw, list) or not raw:
        raise RowRejected("'conversations' must be a non-empty list")
    messages = []
    for index, turn in enumerate(raw):
        if not isinstance(turn, dict):
            raise RowRejected(f"conversations[{index}] is not an object")
        # Either naming; a columnar source has both keys, one of them None.
        speaker = turn.get("from") if turn.get("from") is not None else turn.get("role")
        text = turn.get("value") if turn.get("value") is not None else turn.get("content")
        role = SHAREGPT_ROLES.get(str(speaker).lower())
        if role is None:
            raise RowRejected(f"conversations[{index}] has unknown speaker {speaker!r}")
        if not isinstance(text, str):
            raise RowRejected(f"conversations[{index}] text must be a string, got {type(text).__name__}")
        messages.append({"role": role, "content": text})
    return messages
