"""Export formats: a completion record becomes one line of training or batch-result data.

Every format starts from the same `Conversation`: the prompt messages with the generated assistant
turn(s) in place. With `--regenerate all` the record's `messages` already hold the model's earlier
replies (content only, as the model saw them), and `turns` holds each reply's reasoning too; the
conversation puts each generated turn back where it was generated.

Line shapes (one JSON object per line):
- specforge:    {"id", "conversations": [{"role", "content", "reasoning_content"?}, ...]}
- openai:       {"id", "messages": [{"role", "content", "reasoning_content"?}, ...]}
- sharegpt:     {"id", "conversations": [{"from": "system"|"human"|"gpt"|"tool", "value"}, ...]},
                a generated turn's value being `{start}{reasoning}{end}{content}` with the run's
                reasoning markers (`<think>…</think>` for kimi_k2), its content alone if it has no reasoning
- openai-batch: {"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}, the
                body a `chat.completion` of the last generated turn (see `openai_batch_line`)
- tokenized:    {"id", "input_ids", "loss_mask"} (workers/export_tokenized.py)
`reasoning_content` is present on generated turns with non-empty reasoning; prompt messages are
passed through as they are.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common.reasoning import ReasoningFormat
from workers.errors import PERMANENT

Message = dict[str, Any]
Record = dict[str, Any]
# A format turns a record into the JSON object of its output line.
RecordFormatter = Callable[[Record], dict[str, Any]]

FORMATS = ("specforge", "sharegpt", "openai", "openai-batch", "tokenized")
SHAREGPT_ROLES = {"system": "system", "user": "human", "assistant": "gpt", "tool": "tool"}


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
    # the first user turn (workers/turns.py `reply_positions`).
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


def specforge_line(record: Record) -> dict[str, Any]:
    return {"id": record["id"], "conversations": conversation_of(record).messages}


def openai_line(record: Record) -> dict[str, Any]:
    return {"id": record["id"], "messages": conversation_of(record).messages}


def sharegpt_formatter(reasoning: ReasoningFormat | None) -> RecordFormatter:
    """ShareGPT has no reasoning field: a generated turn carries its reasoning inline, between the
    run's reasoning markers, as the model wrote it."""
    start, end = (reasoning.start, reasoning.end) if reasoning is not None else ("<think>", "</think>")

    def sharegpt_line(record: Record) -> dict[str, Any]:
        conversation = conversation_of(record)
        generated = dict(zip(conversation.generated, conversation.turns, strict=True))
        lines = []
        for index, message in enumerate(conversation.messages):
            turn = generated.get(index)
            if turn is not None:
                value = f"{start}{turn.reasoning}{end}{turn.content}" if turn.reasoning else turn.content
            else:
                value = message.get("content") or ""
            role = message.get("role", "")
            lines.append({"from": SHAREGPT_ROLES.get(role, role), "value": value})
        return {"id": record["id"], "conversations": lines}

    return sharegpt_line


def custom_id(record_id: str, dataset: str) -> str:
    """The row's own key: the prompt id without its `{dataset}/` prefix (the OpenAI Batch
    `custom_id` the user came with, when the input was a batch file)."""
    return record_id.removeprefix(f"{dataset}/")


def _stable_id(kind: str, record_id: str) -> str:
    """Deterministic ids: exporting the same run twice gives byte-identical files."""
    return hashlib.sha256(f"{kind}:{record_id}".encode()).hexdigest()[:24]


def openai_batch_line(record: Record) -> dict[str, Any]:
    """An OpenAI Batch output line (as `vllm run-batch` writes it) for the last generated turn."""
    turn = generated_turns(record)[-1]
    usage = record["usage"]
    record_id = record["id"]
    body = {
        "id": f"chatcmpl-{_stable_id('completion', record_id)}",
        "object": "chat.completion",
        "created": int((record.get("timing") or {}).get("started_at") or 0),
        "model": record.get("model", ""),
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": turn.content, "reasoning_content": turn.reasoning or None},
            "finish_reason": turn.finish_reason,
            "logprobs": None,
        }],
        "usage": {
            "prompt_tokens": usage.get("prompt_tokens", 0),
            "completion_tokens": usage.get("completion_tokens", 0),
            "total_tokens": usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0),
            "prompt_tokens_details": {"cached_tokens": usage.get("cached_tokens", 0)},
            "completion_tokens_details": {"reasoning_tokens": usage.get("reasoning_tokens", 0)},
        },
    }
    return {
        "id": f"batch_req_{_stable_id('batch', record_id)}",
        "custom_id": custom_id(record_id, record["dataset"]),
        "response": {"status_code": 200, "request_id": _stable_id("request", record_id), "body": body},
        "error": None,
    }


def openai_batch_error_line(prompt_id: str, dataset: str, error_class: str, message: str) -> dict[str, Any]:
    """An error-file line for a dead letter: 400 for a permanent failure (the request itself is
    bad), 500 for a transient one that ran out of attempts."""
    return {
        "id": f"batch_req_{_stable_id('batch', prompt_id)}",
        "custom_id": custom_id(prompt_id, dataset),
        "response": {"status_code": 400 if error_class == PERMANENT else 500,
                     "request_id": _stable_id("request", prompt_id), "body": None},
        "error": {"code": error_class, "message": message},
    }
