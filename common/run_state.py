"""A run's shared state in Redis: per-dataset counters, enqueued/done bitmaps, rejections, dead letters.

State is compact by design (DESIGN.md "Scale"): bitmaps over row indices and counter hashes, never a
key per prompt, so ten million prompts cost a few megabytes.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Iterable

import msgpack
import redis

from common.keys import RunKeys
from common.records import TaskPayload

COUNTER_FIELDS = (
    "total", "done", "failed", "rejected", "skipped",
    "prompt_tokens", "completion_tokens", "reasoning_tokens",
    # Data-quality counters: a reasoning model with empty reasoning is the classic silent bug.
    "truncated", "empty_reasoning", "empty_content", "aborted",
)

# Set the done bit and count the record only the first time: a task run twice (a worker died
# after writing, before acking) must not be counted twice.
_MARK_DONE = """
local old = redis.call('SETBIT', KEYS[1], ARGV[1], 1)
if old == 0 then
  for i = 2, #ARGV, 2 do redis.call('HINCRBY', KEYS[2], ARGV[i], ARGV[i + 1]) end
end
return old
"""


@dataclass(frozen=True)
class Outcome:
    """What a finished prompt adds to its dataset's counters."""
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    truncated: bool
    empty_reasoning: bool
    empty_content: bool

    def increments(self) -> dict[str, int]:
        return {
            "done": 1,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "truncated": int(self.truncated),
            "empty_reasoning": int(self.empty_reasoning),
            "empty_content": int(self.empty_content),
        }


class RunState:
    def __init__(self, client: redis.Redis, run: str) -> None:
        self.redis = client
        self.run = run
        self.keys = RunKeys(run)
        self._mark_done = client.register_script(_MARK_DONE)

    # --- producer side -------------------------------------------------------------------
    def register_dataset(self, dataset: str, source: str) -> None:
        self.redis.sadd(self.keys.datasets, dataset)
        self.redis.hsetnx(self.keys.manifest, f"source:{dataset}", source)
        self.redis.hsetnx(self.keys.manifest, "created_at", time.time())

    def unclaimed_rows(self, dataset: str, rows: list[int]) -> list[int]:
        """Rows neither enqueued nor done yet: the ones a (re-)run of the producer must publish."""
        pipe = self.redis.pipeline(transaction=False)
        for row in rows:
            pipe.getbit(self.keys.enqueued(dataset), row)
            pipe.getbit(self.keys.done(dataset), row)
        bits = pipe.execute()
        return [row for i, row in enumerate(rows) if not bits[2 * i] and not bits[2 * i + 1]]

    def mark_enqueued(self, dataset: str, rows: Iterable[int]) -> None:
        pipe = self.redis.pipeline(transaction=True)
        count = 0
        for row in rows:
            pipe.setbit(self.keys.enqueued(dataset), row, 1)
            count += 1
        pipe.hincrby(self.keys.counters(dataset), "total", count)
        pipe.execute()

    def record_rejection(self, dataset: str, row: int, file: str, line: int, reason: str) -> bool:
        """Returns True the first time this row is rejected (re-runs do not count it again)."""
        entry = json.dumps({"file": file, "line": line, "reason": reason})
        if self.redis.hset(self.keys.rejected(dataset), str(row), entry):
            self.redis.hincrby(self.keys.counters(dataset), "rejected", 1)
            return True
        return False

    def rejections(self, dataset: str) -> dict[int, dict]:
        raw = self.redis.hgetall(self.keys.rejected(dataset))
        return {int(row): json.loads(entry) for row, entry in raw.items()}

    # --- worker side ---------------------------------------------------------------------
    def is_done(self, dataset: str, row: int) -> bool:
        return bool(self.redis.getbit(self.keys.done(dataset), row))

    def mark_done(self, dataset: str, row: int, outcome: Outcome) -> bool:
        """Returns True if this was the first completion of the row."""
        args: list[int | str] = [row]
        for name, value in outcome.increments().items():
            args += [name, value]
        old = self._mark_done(keys=[self.keys.done(dataset), self.keys.counters(dataset)], args=args)
        return old == 0

    def record_dead_letter(self, payload: TaskPayload, error_class: str, message: str,
                           upstream: str | None) -> None:
        letter = msgpack.packb({
            "payload": payload.to_dict(), "error_class": error_class, "message": message,
            "attempts": payload.attempt, "upstream": upstream, "time": time.time(),
        }, use_bin_type=True)
        if self.redis.hset(self.keys.dead_letters, payload.id, letter):
            self.redis.hincrby(self.keys.counters(payload.dataset), "failed", 1)

    def count(self, dataset: str, counter: str, amount: int = 1) -> None:
        self.redis.hincrby(self.keys.counters(dataset), counter, amount)

    def dead_letters(self) -> dict[str, dict]:
        raw = self.redis.hgetall(self.keys.dead_letters)
        return {key.decode() if isinstance(key, bytes) else key: msgpack.unpackb(value, raw=False)
                for key, value in raw.items()}

    # --- readers -------------------------------------------------------------------------
    def datasets(self) -> list[str]:
        return sorted(_text(name) for name in self.redis.smembers(self.keys.datasets))

    def counters(self, dataset: str) -> dict[str, int]:
        raw = self.redis.hgetall(self.keys.counters(dataset))
        values = {_text(k): int(v) for k, v in raw.items()}
        return {name: values.get(name, 0) for name in COUNTER_FIELDS}

    def done_rows(self, dataset: str) -> int:
        return self.redis.bitcount(self.keys.done(dataset))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def connect(url: str) -> redis.Redis:
    # Sized for a threads pool: every in-flight task may touch Redis at the end of its stream.
    return redis.Redis.from_url(url, max_connections=512, health_check_interval=30,
                                socket_keepalive=True, retry_on_timeout=True)
