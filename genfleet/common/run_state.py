"""A run's state in Redis, read and written in one place: the rows' bitmaps, the counters and done bits
(with `publish.lua`, `mark_done.lua`), the dead letters and the run manifest.

The one codec for a run's bitmaps over row indices (`enqueued`, `done`, and export's seen rows).

Redis numbers a string's bits from the most significant bit of its first byte: "thinking of the
string as an array of bits from left to right, where the first byte's most significant bit is at
position 0, the second byte's most significant bit is at position 8, and so forth. The same bit
position convention is followed by GETBIT and SETBIT" (https://redis.io/commands/bitpos, and
https://redis.io/commands/setbit). So row `r` is bit `0x80 >> (r % 8)` of byte `r // 8`; a missing
key reads as an empty string, i.e. no row set. Every place that decodes such a bitmap read with GET
or GETRANGE goes through here, so the bit order is written down once.

The dead letter: a prompt that failed for good, with why. One type, one stored format.

Stored as one field of the run's `dead` hash (`RunKeys.dead_letters`): the prompt id -> this
document packed with msgpack. `RunState.record_dead_letter` writes it (the worker's failure
policy decides when), the operator tooling (`genfleet failures`, `requeue`, export's error files
and reconciliation, `enqueue --recover-lost`) reads it back through `DeadLetter.decode`.

A run's manifest hash and datasets set: the only module that writes them.

The manifest is a contract between processes: the producer records what config a run was enqueued
with (`producer/manifest.py` decides what is hashed and refuses a changed config), workers read a
dataset's token budget, `status` the run's start, export the tokenizer and the config hash. So its
writer lives here beside the field names (`common/keys.py`'s `ManifestFields`), not in the producer.

Every field but `successor` is written once (HSETNX): a re-run never rewrites history.

A run's shared state in Redis: per-dataset counters, enqueued/done bitmaps, rejections, dead letters.

`RunState` is the only writer of those keys (see docs/ARCHITECTURE.md, "Who writes which Redis
key"): the producer publishes through `publish` (the Lua script `common/publish.lua`, which also
pushes onto kombu's queue lists), `enqueue --recover-lost` releases rows through
`release_enqueued`, workers settle rows and dead-letter prompts, `requeue` forgets letters. The
manifest and datasets set are `RunManifest`'s; RunState only reads them.

State is compact by design: bitmaps over row indices and counter hashes, never a key per prompt,
so ten million prompts cost a few megabytes.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import msgpack
import redis
from redis.backoff import ExponentialBackoff
from redis.commands.core import Script
from redis.retry import Retry

from genfleet.common import fleet_stats
from genfleet.common.keys import ManifestFields, RunKeys, queue_list
from genfleet.common.records import CompletionRecord, TaskPayload
from genfleet.common.settings import verify_tls_by_default

# Byte value -> the bit positions (0 = most significant) set in it: decoding then costs one table
# lookup per non-zero byte instead of eight tests.
_SET_POSITIONS: tuple[tuple[int, ...], ...] = tuple(
    tuple(bit for bit in range(8) if value & (0x80 >> bit)) for value in range(256))


def locate(row: int) -> tuple[int, int]:
    """(byte index, mask within that byte) of `row`'s bit."""
    return row >> 3, 0x80 >> (row & 7)


def is_set(bitmap: bytes, row: int, *, first_byte: int = 0) -> bool:
    """Whether `row` is set in `bitmap`, which holds the bytes from `first_byte` on (a GETRANGE)."""
    index, mask = locate(row)
    offset = index - first_byte
    return 0 <= offset < len(bitmap) and bool(bitmap[offset] & mask)


def set_rows(bitmap: bytes, *, first_byte: int = 0) -> Iterator[int]:
    """The rows set in `bitmap` (bytes from `first_byte` on), in increasing order."""
    for index, value in enumerate(bitmap, start=first_byte):
        if value:
            base = index * 8
            for bit in _SET_POSITIONS[value]:
                yield base + bit


def to_int(bitmap: bytes, width: int) -> int:
    """`bitmap` padded to `width` bytes as one integer, row 0 its most significant bit: whole-bitmap
    AND / AND NOT / popcount (`int.bit_count`) in C instead of a loop over rows."""
    return int.from_bytes(bitmap.ljust(width, b"\0"), "big")


def from_int(bits: int, width: int) -> bytes:
    """The inverse of `to_int`: the `width`-byte bitmap whose bits are those of `bits`."""
    return bits.to_bytes(width, "big")


def from_rows(rows: Iterable[int]) -> bytes:
    """The bitmap with exactly `rows` set (what SETBIT on each would leave), as short as it can be."""
    rows = list(rows)
    if not rows:
        return b""
    width = (max(rows) >> 3) + 1
    bits = 0
    for row in rows:
        bits |= 1 << (width * 8 - 1 - row)
    return from_int(bits, width)


# The classes of a failed attempt. `transient` is retried; the other three are dead-letter classes:
# `permanent` (the request itself is wrong), `exhausted` (transient beyond the attempts),
# `integrity` (the stream contradicted itself on every attempt).
TRANSIENT = "transient"
PERMANENT = "permanent"
EXHAUSTED = "exhausted"
INTEGRITY = "integrity"


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


class RunManifest:
    def __init__(self, client: redis.Redis, run: str) -> None:
        self.redis, self.run = client, run
        self.keys = RunKeys(run)

    # --- writers ---------------------------------------------------------------------------
    def record(self, fields: Mapping[str, str | int | float], datasets: Iterable[str]) -> None:
        """Writes each field the first time it is seen (with the run's `created_at`), and adds the
        datasets, in one transaction; never overwrites."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hsetnx(self.keys.manifest, ManifestFields.CREATED_AT, time.time())
        for name, value in fields.items():
            pipe.hsetnx(self.keys.manifest, name, value)
        names = list(datasets)
        if names:
            pipe.sadd(self.keys.datasets, *names)
        pipe.execute()

    def register_dataset(self, dataset: str, source: str) -> None:
        """A dataset and where it was read from, without a config (tools that seed a run by hand)."""
        self.record({ManifestFields.source(dataset): source}, [dataset])

    def mark_superseded(self, successor: str) -> None:
        """`enqueue --new-run`: the run that replaced this one (the one field that may change)."""
        self.redis.hset(self.keys.manifest, ManifestFields.SUCCESSOR, successor)

    def forget_if_unpublished(self) -> bool:
        """Drops the manifest of a run that never published a prompt (every row was rejected), so a
        corrected command may enqueue under the same name; returns whether it did. Atomic: a
        publish that lands meanwhile keeps the manifest."""
        names = self.datasets()
        counters = [self.keys.counters(name) for name in names]
        forgotten = self.redis.eval(_FORGET_IF_UNPUBLISHED, 2 + len(counters), self.keys.manifest,
                                    self.keys.datasets, *counters)
        return bool(forgotten)

    # --- readers ---------------------------------------------------------------------------
    def fields(self) -> dict[str, str]:
        return {_text(k): _text(v) for k, v in self.redis.hgetall(self.keys.manifest).items()}

    def budget(self, dataset: str) -> int | None:
        """The dataset's completion-token budget as the producer recorded it (None: no budget)."""
        value = self.redis.hget(self.keys.manifest, ManifestFields.budget(dataset))
        return int(value) if value is not None else None

    def datasets(self) -> list[str]:
        return sorted(_text(name) for name in self.redis.smembers(self.keys.datasets))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


COUNTER_FIELDS = (
    "total", "done", "failed", "rejected", "skipped",
    "prompt_tokens", "completion_tokens", "reasoning_tokens",
    # Data-quality counters: a reasoning model with empty reasoning is the classic silent bug.
    "truncated", "empty_reasoning", "empty_content", "aborted",
    # `integrity`: attempts whose stream contradicted itself (nothing written; retried). `looped`:
    # completions the loop guard stopped or flagged, and the tokens they cost. `continued` and
    # `regenerated`: completions cut at max_new_tokens that were continued (past a staged first
    # cap too: `--first-max-new-tokens`) or asked again.
    "integrity", "looped", "looped_tokens", "continued", "regenerated",
)

# KEYS: the manifest, the datasets set, then each dataset's counters hash.
_FORGET_IF_UNPUBLISHED = """
for i = 3, #KEYS do
  if tonumber(redis.call('HGET', KEYS[i], 'total') or '0') > 0 then return 0 end
end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
"""

_SUSPECTS = "suspects:"  # field prefix in the run's `unaccounted` hash
# The scripts live beside this module as files (as dramatiq keeps its broker's Lua scripts).
_MARK_DONE = resources.files(__package__).joinpath("mark_done.lua").read_text(encoding="utf-8")
_PUBLISH = resources.files(__package__).joinpath("publish.lua").read_text(encoding="utf-8")
# Redis 7 checks a flagged script for out-of-memory before it starts, never half-way through:
# without the flag line an OOM error could stop the script after some of its writes.
_PUBLISH_FLAGGED = "#!lua\n" + _PUBLISH


@dataclass(frozen=True)
class Outcome:
    """What a finished prompt adds to its dataset's counters."""
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    truncated: bool
    empty_reasoning: bool
    empty_content: bool
    looped: bool = False
    continued: bool = False
    regenerated: bool = False

    @classmethod
    def of_record(cls, record: CompletionRecord, *, expects_reasoning: bool) -> Outcome:
        """What `record` adds: the worker's as it writes it, `genfleet recover`'s as it reads it back."""
        return cls(
            prompt_tokens=record.usage.prompt_tokens, completion_tokens=record.usage.completion_tokens,
            reasoning_tokens=record.usage.reasoning_tokens, truncated=record.finish_reason == "length",
            empty_reasoning=expects_reasoning and not record.reasoning.strip(),
            empty_content=not record.content.strip(), looped=record.loop is not None,
            continued=bool(record.continued), regenerated=bool(record.regenerated),
        )

    def increments(self) -> dict[str, int]:
        return {
            "done": 1, "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "reasoning_tokens": self.reasoning_tokens, "truncated": int(self.truncated),
            "empty_reasoning": int(self.empty_reasoning), "empty_content": int(self.empty_content),
            "looped": int(self.looped), "looped_tokens": self.completion_tokens if self.looped else 0,
            "continued": int(self.continued), "regenerated": int(self.regenerated),
        }


@dataclass(frozen=True, slots=True)
class OutgoingTask:
    """One encoded task for `publish`: its row, its queue, the kombu message and task-sent event."""
    row: int
    partition: str
    message: bytes
    event: bytes = b""  # the task-sent event, empty when events are off


@dataclass(frozen=True, slots=True)
class RowRejection:
    row: int
    file: str
    line: int
    reason: str

    def entry(self) -> str:
        return json.dumps({"file": self.file, "line": self.line, "reason": self.reason})


@dataclass(frozen=True)
class Published:
    """What one `publish` call did."""
    pushed: dict[str, int]  # queue -> tasks pushed onto it
    claimed: int  # rows found enqueued or done at publish time (another producer got there first)
    new_rejections: int


class RunState:
    def __init__(self, client: redis.Redis, run: str) -> None:
        self.redis = client
        self.run = run
        self.keys = RunKeys(run)
        self.run_manifest = RunManifest(client, run)
        self._mark_done = client.register_script(_MARK_DONE)
        self._publish: Script | None = None  # registered on first use

    # --- producer side -------------------------------------------------------------------
    def register_dataset(self, dataset: str, source: str) -> None:
        self.run_manifest.register_dataset(dataset, source)

    def publish(self, dataset: str, tasks: Sequence[OutgoingTask], rejections: Sequence[RowRejection], *,
                queues: Sequence[str], event_channel: str = "") -> Published:
        """One atomic step: pushes every task whose row is neither enqueued nor done onto its queue
        (marking it enqueued, counting it in `total`), publishes its task-sent event on
        `event_channel` ('' for none), and records the rejections (counted once per row)."""
        number = {queue: i for i, queue in enumerate(queues, start=1)}
        args: list[int | str | bytes] = [len(tasks), len(rejections), event_channel]
        for task in tasks:
            args += (task.row, number[task.partition], task.message, task.event)
        for rejection in rejections:
            args += (rejection.row, rejection.entry())
        keys = [self.keys.enqueued(dataset), self.keys.done(dataset), self.keys.counters(dataset),
                self.keys.rejected(dataset), *(queue_list(queue) for queue in queues)]
        reply = self._publish_script()(keys=keys, args=args)
        return Published({queue: int(count) for queue, count in zip(queues, reply, strict=False)},
                         claimed=int(reply[len(queues)]), new_rejections=int(reply[len(queues) + 1]))

    def release_enqueued(self, dataset: str, rows: Sequence[int]) -> None:
        """Forget that these rows were enqueued (they were lost in transit), so the next publish
        of the dataset includes them; `total` counts them again then."""
        pipe = self.redis.pipeline(transaction=True)
        for row in rows:
            pipe.setbit(self.keys.enqueued(dataset), row, 0)
        pipe.hincrby(self.keys.counters(dataset), "total", -len(rows))
        pipe.execute()

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
            if is_set(done_bits, row, first_byte=first):
                done.add(row)
            elif is_set(enqueued_bits, row, first_byte=first):
                enqueued.add(row)
        return enqueued, done

    def enqueued_row_set(self, dataset: str) -> set[int]:
        return set(set_rows(self.redis.get(self.keys.enqueued(dataset)) or b""))

    def done_row_set(self, dataset: str) -> set[int]:
        return set(set_rows(self.redis.get(self.keys.done(dataset)) or b""))

    def rejections(self, dataset: str) -> dict[int, dict]:
        raw = self.redis.hgetall(self.keys.rejected(dataset))
        return {int(row): json.loads(entry) for row, entry in raw.items()}

    # --- worker side ---------------------------------------------------------------------
    def is_done(self, dataset: str, row: int) -> bool:
        return bool(self.redis.getbit(self.keys.done(dataset), row))

    def mark_done(self, dataset: str, row: int, outcome: Outcome,
                  updates: Sequence[fleet_stats.KeyUpdate] = ()) -> bool:
        """Returns True if this was the first completion of the row. `updates` (its rates:
        `fleet_stats.completion_updates`) go with the counters: once per row, in the same round trip."""
        keys, args = self._mark_done_call(dataset, row, outcome, updates)
        return self._mark_done(keys=keys, args=args) == 0

    def mark_recovered(self, dataset: str, rows: Sequence[tuple[int, Outcome, Sequence[fleet_stats.KeyUpdate]]],
                       ) -> tuple[int, int]:
        """Rows whose records were found on disk (genfleet/recover.py): each settled as its worker
        settled it (the same script: counted once per row, however often this runs), and marked
        published as the producer marks it, counted in `total` once. One round trip for all.
        Returns (rows settled now, rows newly counted as published)."""
        if not rows:
            return 0, 0
        pipe = self.redis.pipeline(transaction=False)
        for row, outcome, updates in rows:
            keys, args = self._mark_done_call(dataset, row, outcome, updates)
            self._mark_done(keys=keys, args=args, client=pipe)
            pipe.setbit(self.keys.enqueued(dataset), row, 1)
        replies = pipe.execute()
        settled = sum(1 for old in replies[0::2] if old == 0)
        published = sum(1 for old in replies[1::2] if old == 0)
        if published:
            self.redis.hincrby(self.keys.counters(dataset), "total", published)
        return settled, published

    def _mark_done_call(self, dataset: str, row: int, outcome: Outcome,
                        updates: Sequence[fleet_stats.KeyUpdate]) -> tuple[list[str], list[int | str | float]]:
        counters = outcome.increments()
        keys = [self.keys.done(dataset), self.keys.counters(dataset)]
        args: list[int | str | float] = [row, len(counters), *(part for pair in counters.items() for part in pair)]
        for command, key, field, value in updates:
            keys += [] if key in keys else [key]
            args += [command, keys.index(key) + 1, field, value]
        return keys, args

    def mark_skipped(self, dataset: str, row: int) -> bool:
        """A prompt that will not be generated (its dataset's token budget is spent): settled like
        a done one, so resume never re-enqueues it, but counted as skipped."""
        old = self._mark_done(keys=[self.keys.done(dataset), self.keys.counters(dataset)], args=[row, 1, "skipped", 1])
        return old == 0

    def record_dead_letter(self, payload: TaskPayload, error_class: str, message: str,
                           upstream: str | None) -> None:
        letter = DeadLetter.of(payload, error_class, message, upstream)
        if self.redis.hset(self.keys.dead_letters, payload.id, letter.encode()):
            self.redis.hincrby(self.keys.counters(payload.dataset), "failed", 1)

    def completion_tokens(self, dataset: str) -> int:
        return int(self.redis.hget(self.keys.counters(dataset), "completion_tokens") or 0)

    def count(self, dataset: str, counter: str, amount: int = 1) -> None:
        self.redis.hincrby(self.keys.counters(dataset), counter, amount)

    # --- operator side -------------------------------------------------------------------
    def forget_dead_letter(self, dataset: str, prompt_id: str) -> None:
        """After a dead letter is re-published: it is pending again, not failed."""
        if self.redis.hdel(self.keys.dead_letters, prompt_id):
            self.redis.hincrby(self.keys.counters(dataset), "failed", -1)

    def read_dead_letters(self) -> list[DeadLetter]:
        """Every dead letter of the run, oldest first."""
        raw = self.redis.hgetall(self.keys.dead_letters)
        return sorted((DeadLetter.decode(key, value) for key, value in raw.items()),
                      key=lambda letter: letter.time)

    def dead_letters(self) -> dict[str, dict]:
        """Prompt id -> the stored document of its dead letter (`DeadLetter.to_dict`)."""
        return {letter.id: letter.to_dict() for letter in self.read_dead_letters()}

    # --- the workers' check for lost prompts (workers/delivery.py) --------------------
    def record_unaccounted(self, found: Mapping[str, set[int]]) -> dict[str, set[int]]:
        """One check's rows per dataset that no message holds and are neither done nor dead. Returns
        (and records, for `unaccounted`) those the previous check found too; forgets the rest."""
        previous = {_text(f)[len(_SUSPECTS):]: v for f, v in self.redis.hgetall(self.keys.unaccounted).items()
                    if _text(f).startswith(_SUSPECTS)}
        confirmed = {ds: both for ds, rows in found.items()
                     if (both := rows & set(set_rows(previous.get(ds, b""))))}
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self.keys.unaccounted)
        for dataset, rows in found.items():
            if rows:
                pipe.hset(self.keys.unaccounted, f"{_SUSPECTS}{dataset}", from_rows(rows))
        for dataset, rows in confirmed.items():
            pipe.hset(self.keys.unaccounted, dataset, len(rows))
        pipe.execute()
        return confirmed

    def unaccounted(self) -> dict[str, int]:
        """Dataset -> prompts lost: neither queued, running, done, dead, rejected nor skipped."""
        return {_text(f): int(v) for f, v in self.redis.hgetall(self.keys.unaccounted).items()
                if not _text(f).startswith(_SUSPECTS)}

    # --- readers -------------------------------------------------------------------------
    def manifest(self) -> dict[str, str]:
        return self.run_manifest.fields()

    def datasets(self) -> list[str]:
        return self.run_manifest.datasets()

    def counters(self, dataset: str) -> dict[str, int]:
        raw = self.redis.hgetall(self.keys.counters(dataset))
        values = {_text(k): int(v) for k, v in raw.items()}
        return {name: values.get(name, 0) for name in COUNTER_FIELDS}

    def _publish_script(self) -> Script:
        if self._publish is None:
            version = tuple(int(part) for part in str(self.redis.info("server")["redis_version"]).split(".")[:2])
            self._publish = self.redis.register_script(_PUBLISH_FLAGGED if version >= (7, 0) else _PUBLISH)
        return self._publish


def created_at(client: redis.Redis, runs: Sequence[str]) -> list[str | None]:
    """When each run's manifest says it was first enqueued (None: no manifest), one round trip."""
    pipe = client.pipeline(transaction=False)
    for run in runs:
        pipe.hget(RunKeys(run).manifest, ManifestFields.CREATED_AT)
    return [value.decode() if isinstance(value, bytes) else value for value in pipe.execute()]


def connect(url: str, *, timeout_s: float | None = None) -> redis.Redis:
    """A client sized for a threads pool (every in-flight task may touch Redis at the end of its
    stream) that rides out a Redis restart: commands retry with backoff for about two minutes.
    With `timeout_s` (an operator's command, e.g. `genfleet status`): no retry, and connecting or
    any one command fails after that many seconds."""
    if timeout_s is not None:
        return redis.Redis.from_url(verify_tls_by_default(url), socket_connect_timeout=timeout_s,
                                    socket_timeout=timeout_s, retry=Retry(ExponentialBackoff(), retries=0))
    return redis.Redis.from_url(
        verify_tls_by_default(url), max_connections=512, health_check_interval=30, socket_keepalive=True,
        retry=Retry(ExponentialBackoff(cap=5.0, base=0.2), retries=30),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
    )
