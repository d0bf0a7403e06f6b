"""The dead letter: a prompt that failed for good, with why. One type, one stored format.

Stored as one field of the run's `dead` hash (`RunKeys.dead_letters`): the prompt id -> this
document packed with msgpack. `RunState.record_dead_letter` writes it (the worker's failure
policy decides when), the operator tooling (`genfleet failures`, `requeue`, export's error files
and reconciliation, `enqueue --recover-lost`) reads it back through `DeadLetter.decode`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import msgpack

from genfleet.common.records import TaskPayload

# The classes of a failed attempt. `transient` is retried; the other three are dead-letter classes:
# `permanent` (the request itself is wrong), `exhausted` (transient beyond the attempts),
# `integrity` (the stream contradicted itself on every attempt).
TRANSIENT = "transient"
PERMANENT = "permanent"
EXHAUSTED = "exhausted"
INTEGRITY = "integrity"
DEAD_LETTER_CLASSES = (PERMANENT, EXHAUSTED, INTEGRITY)


@dataclass(frozen=True)
class DeadLetter:
    id: str  # the prompt id, the field of the `dead` hash
    payload: TaskPayload  # as the last attempt received it
    error_class: str  # permanent, exhausted, integrity
    message: str
    attempts: int
    upstream: str | None  # the SGLang host of the last attempt, if one was reached
    time: float  # unix time it was dead-lettered

    @classmethod
    def of(cls, payload: TaskPayload, error_class: str, message: str, upstream: str | None,
           now: float | None = None) -> DeadLetter:
        """The letter for `payload`'s last attempt, dead-lettered now."""
        return cls(id=payload.id, payload=payload, error_class=error_class, message=message,
                   attempts=payload.attempt, upstream=upstream, time=time.time() if now is None else now)

    def to_dict(self) -> dict[str, Any]:
        """The stored document (the id is the hash field, not part of it)."""
        return {"payload": self.payload.to_dict(), "error_class": self.error_class, "message": self.message,
                "attempts": self.attempts, "upstream": self.upstream, "time": self.time}

    def encode(self) -> bytes:
        return msgpack.packb(self.to_dict(), use_bin_type=True)

    @classmethod
    def decode(cls, prompt_id: bytes | str, data: bytes) -> DeadLetter:
        document = msgpack.unpackb(data, raw=False)
        return cls(id=prompt_id.decode() if isinstance(prompt_id, bytes) else prompt_id,
                   payload=TaskPayload.from_dict(document["payload"]), error_class=document["error_class"],
                   message=document["message"], attempts=document["attempts"],
                   upstream=document.get("upstream"), time=document["time"])
