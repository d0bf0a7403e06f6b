"""The two records that cross process boundaries: the task payload (msgpack, producer -> worker)
and the completion record (one JSON line in a shard, worker -> disk)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import msgpack

Message = dict[str, Any]


@dataclass
class TaskPayload:
    run: str
    id: str
    dataset: str
    row: int
    partition: str
    prompt_tokens: int
    max_new_tokens: int
    messages: list[Message]
    # Exactly the tokens the chat template produced: no double BOS, no re-tokenisation drift.
    input_ids: list[int] | None = None
    text: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    enqueued_at: float = 0.0
    attempt: int = 1
    # Store the generated token ids in the record (token-exact training data).
    keep_token_ids: bool = False
    # "last": reply to the prompt in `messages`; "all": regenerate every assistant turn.
    regenerate: str = "last"
    # Completion tokens the whole dataset may generate (workers skip prompts past it); None: no cap.
    max_tokens_per_dataset: int | None = None
    # The upstream the previous attempt failed on: a retry prefers another one.
    failed_upstream: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def argsrepr(self, note: str = "") -> str:
        """What Flower shows as the task's args: the id and size, never the prompt itself."""
        return f"{self.id} {self.partition} {self.prompt_tokens} prompt tokens" + (f" ({note})" if note else "")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskPayload:
        return cls(**data)

    def to_msgpack(self) -> bytes:
        return msgpack.packb(self.to_dict(), use_bin_type=True)

    @classmethod
    def from_msgpack(cls, data: bytes) -> TaskPayload:
        return cls.from_dict(msgpack.unpackb(data, raw=False))


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cached_tokens: int


@dataclass
class Timing:
    enqueued_at: float
    started_at: float
    first_token_s: float | None
    duration_s: float
    e2e_latency: float | None = None  # the server's own measure, from the last chunk


@dataclass
class CompletionRecord:
    id: str
    run: str
    dataset: str
    partition: str
    messages: list[Message]
    reasoning: str
    content: str
    finish_reason: str  # "stop" | "length" | "abort"
    matched_stop: int | str | list[int] | None
    usage: Usage
    upstream: str
    model: str
    sampling: dict[str, Any]
    timing: Timing
    attempts: int
    worker: str
    output_ids: list[int] | None = None
    # With `--regenerate all`: every generated turn in order (reasoning, content, finish, usage).
    turns: list[dict[str, Any]] | None = None
    # The prompt's row index in its dataset (the bit in the run's done bitmap): lets export
    # reconcile shards against Redis.
    row: int | None = None

    def to_json_line(self) -> bytes:
        data = asdict(self)
        for optional in ("output_ids", "turns"):
            if data[optional] is None:
                del data[optional]
        return (json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n").encode()

    @classmethod
    def from_json(cls, line: str | bytes) -> CompletionRecord:
        data = json.loads(line)
        data["usage"] = Usage(**data["usage"])
        data["timing"] = Timing(**data["timing"])
        return cls(**data)


@dataclass
class Turn:
    """One generated assistant turn."""
    reasoning: str
    content: str
    finish_reason: str
    matched_stop: int | str | list[int] | None
    usage: Usage
    upstream: str
    output_ids: list[int] | None = None
