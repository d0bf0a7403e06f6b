"""A run's shared state in Redis: per-dataset counters, enqueued/done bitmaps, rejections, dead letters.

State is compact by design (DESIGN.md "Scale"): bitmaps over row indices and counter hashes, never a
key per prompt, so ten million prompts cost a few megabytes.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

import msgpack
import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from common.keys import ManifestFields, RunKeys
from common.records import TaskPayload
from common.settings import verify_tls_by_default

COUNTER_FIELDS = (
    "total", "done", "failed", "rejected", "skipped",
    "prompt_tokens", "completion_tokens", "reasoning_tokens",
    # Data-quality counters: a reasoning model with empty reasoning is the classic silent bug.
    "truncated", "empty_reasoning", "empty_content", "aborted",
    # Attempts whose stream contradicted itself (nothing was written; the prompt was retried).
    "integrity",
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
        self.redis.hsetnx(self.keys.manifest, ManifestFields.source(dataset), source)
        self.redis.hsetnx(self.keys.manifest, ManifestFields.CREATED_AT, time.time())

    def row_claims(self, dataset: str, rows: list[int]) -> tuple[set[int], set[int]]:
        """Which of `rows` are already enqueued (not done yet) and which are done.

        Reads one byte range of each bitmap: a producer's batch is a run of nearby rows, so this
        is two round trips' worth of work for any batch size instead of two GETBITs per row."""
        if not rows:
            return set(), set()
        first, last = min(rows) >> 3, max(rows) >> 3
        pipe = self.redis.pipeline(transaction=False)
        pipe.getrange(self.keys.enqueued(dataset), first, last)
        pipe.getrange(self.keys.done(dataset), first, last)
        enqueued_bits, done_bits = pipe.execute()
        enqueued, done = set(), set()
        for row in rows:
            offset, mask = (row >> 3) - first, 0x80 >> (row & 7)  # Redis bitmaps are MSB first
            if offset < len(done_bits) and done_bits[offset] & mask:
                done.add(row)
            elif offset < len(enqueued_bits) and enqueued_bits[offset] & mask:
                enqueued.add(row)
        return enqueued, done

    def unclaimed_rows(self, dataset: str, rows: list[int]) -> list[int]:
        """Rows neither enqueued nor done yet: the ones a (re-)run of the producer must publish."""
        enqueued, done = self.row_claims(dataset, rows)
        return [row for row in rows if row not in enqueued and row not in done]

    def manifest(self) -> dict[str, str]:
        return {_text(k): _text(v) for k, v in self.redis.hgetall(self.keys.manifest).items()}

    def dataset_budget(self, dataset: str) -> int | None:
        """The dataset's completion-token budget as the producer recorded it (None: no budget)."""
        value = self.redis.hget(self.keys.manifest, ManifestFields.budget(dataset))
        return int(value) if value is not None else None

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

    def mark_skipped(self, dataset: str, row: int) -> bool:
        """A prompt that will not be generated (its dataset's token budget is spent): settled like
        a done one, so resume never re-enqueues it, but counted as skipped."""
        old = self._mark_done(keys=[self.keys.done(dataset), self.keys.counters(dataset)], args=[row, "skipped", 1])
        return old == 0

    def completion_tokens(self, dataset: str) -> int:
        return int(self.redis.hget(self.keys.counters(dataset), "completion_tokens") or 0)

    def count(self, dataset: str, counter: str, amount: int = 1) -> None:
        self.redis.hincrby(self.keys.counters(dataset), counter, amount)

    def forget_dead_letter(self, dataset: str, prompt_id: str) -> None:
        """After a dead letter is re-published: it is pending again, not failed."""
        if self.redis.hdel(self.keys.dead_letters, prompt_id):
            self.redis.hincrby(self.keys.counters(dataset), "failed", -1)

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
    """A client sized for a threads pool (every in-flight task may touch Redis at the end of its
    stream) that rides out a Redis restart: commands retry with backoff for about two minutes."""
    return redis.Redis.from_url(
        verify_tls_by_default(url), max_connections=512, health_check_interval=30, socket_keepalive=True,
        retry=Retry(ExponentialBackoff(cap=5.0, base=0.2), retries=30),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
    )
