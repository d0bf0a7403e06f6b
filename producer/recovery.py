"""Finds prompts lost between a queue and a worker, so that a re-run of the producer publishes them
again.

kombu's Redis transport takes a message off its queue with BRPOP and only then records it as
unacknowledged; a worker SIGKILLed (or OOM-killed) in between loses that message. Such a prompt is
marked enqueued, is not done and not dead-lettered, and sits in no queue and no unacked set. Clearing
its enqueued bit makes the ordinary enqueue path publish it once more.

Run it when the fleet is drained or idle: a message caught in a live worker's BRPOP at the moment of
the scan would be published twice (the worker that runs second sees the done bit and skips, and
export dedupes by id anyway).
"""
from __future__ import annotations

import base64
import json
from collections import defaultdict
from typing import Any, Iterator

import msgpack
import redis

from common.keys import KOMBU_UNACKED, queue_list
from common.queues import PARTITIONS
from common.run_state import RunState

SCAN_CHUNK = 1000


def find_lost_rows(client: redis.Redis, run: str, datasets: list[str]) -> dict[str, list[int]]:
    """Per dataset, the rows enqueued but neither done, dead, queued nor held by a worker."""
    state = RunState(client, run)
    in_flight = _rows_in_flight(client, run)
    dead: dict[str, set[int]] = defaultdict(set)
    for letter in state.dead_letters().values():
        dead[letter["payload"]["dataset"]].add(letter["payload"]["row"])
    lost = {}
    for dataset in datasets:
        enqueued = _set_bits(client.get(state.keys.enqueued(dataset)) or b"")
        done = _set_bits(client.get(state.keys.done(dataset)) or b"")
        rows = sorted(enqueued - done - dead[dataset] - in_flight[dataset])
        if rows:
            lost[dataset] = rows
    return lost


def release_rows(client: redis.Redis, run: str, dataset: str, rows: list[int]) -> None:
    """Forget that these rows were enqueued, so the next publish of the dataset includes them."""
    state = RunState(client, run)
    pipe = client.pipeline(transaction=True)
    for row in rows:
        pipe.setbit(state.keys.enqueued(dataset), row, 0)
    pipe.hincrby(state.keys.counters(dataset), "total", -len(rows))  # counted again when re-published
    pipe.execute()


def _rows_in_flight(client: redis.Redis, run: str) -> dict[str, set[int]]:
    rows: dict[str, set[int]] = defaultdict(set)
    for message in _queued_and_unacked(client):
        payload = _payload(message)
        if payload and payload.get("run") == run:
            rows[payload["dataset"]].add(payload["row"])
    return rows


def _queued_and_unacked(client: redis.Redis) -> Iterator[dict[str, Any]]:
    for queue in PARTITIONS:
        key = queue_list(queue)
        for start in range(0, client.llen(key), SCAN_CHUNK):
            for raw in client.lrange(key, start, start + SCAN_CHUNK - 1):
                yield json.loads(raw)
    for _tag, raw in client.hscan_iter(KOMBU_UNACKED, count=SCAN_CHUNK):
        message, _exchange, _routing_key = json.loads(raw)
        yield message


def _payload(message: dict[str, Any]) -> dict[str, Any] | None:
    if message.get("content-type") != "application/x-msgpack":
        return None
    body = message["body"]
    if message.get("properties", {}).get("body_encoding") == "base64":
        body = base64.b64decode(body)
    args, _kwargs, _embed = msgpack.unpackb(body, raw=False)
    return args[0] if args and isinstance(args[0], dict) else None


def _set_bits(bitmap: bytes) -> set[int]:
    """Row indices whose bit is set (Redis bitmaps are most significant bit first)."""
    rows = set()
    for index, byte in enumerate(bitmap):
        if byte:
            rows.update(index * 8 + bit for bit in range(8) if byte & (0x80 >> bit))
    return rows
