"""Finds prompts lost between a queue and a worker, so that a re-run of the producer publishes them
again.

kombu's Redis transport takes a message off its queue with BRPOP and only then records it as
unacknowledged; a worker SIGKILLed (or OOM-killed) in between lost that message. genfleet's workers
take it onto a transit list instead, which the reaper puts back (workers/broker.py); a message can
still vanish otherwise (a Redis without AOF restarted, a key deleted by hand), and the workers' check
then shows its prompt in `genfleet status`. Such a prompt is marked enqueued, is not done and not
dead-lettered, and sits in no queue, transit list or unacked set. Clearing its enqueued bit
(`RunState.release_enqueued`) makes the ordinary enqueue path publish it once more.

Run it when the fleet is drained or idle: a message moving between lists at the moment of the scan
would be published twice (the worker that runs second sees the done bit and skips, and export
dedupes by id anyway).
"""
from __future__ import annotations

from collections import defaultdict

import redis

from genfleet.common import kombu_wire
from genfleet.common.run_state import RunState

SCAN_CHUNK = 1000


def find_lost_rows(client: redis.Redis, run: str, datasets: list[str]) -> dict[str, list[int]]:
    """Per dataset, the rows enqueued but neither done, dead, queued nor held by a worker."""
    state = RunState(client, run)
    in_flight = _rows_in_flight(client, run)
    dead: dict[str, set[int]] = defaultdict(set)
    for letter in state.read_dead_letters():
        dead[letter.payload.dataset].add(letter.payload.row)
    lost = {}
    for dataset in datasets:
        rows = sorted(state.enqueued_row_set(dataset) - state.done_row_set(dataset) - dead[dataset]
                      - in_flight[dataset])
        if rows:
            lost[dataset] = rows
    return lost


def release_rows(client: redis.Redis, run: str, dataset: str, rows: list[int]) -> None:
    """Forget that these rows were enqueued, so the next publish of the dataset includes them."""
    RunState(client, run).release_enqueued(dataset, rows)


def _rows_in_flight(client: redis.Redis, run: str) -> dict[str, set[int]]:
    rows: dict[str, set[int]] = defaultdict(set)
    for envelope in kombu_wire.held_messages(client, SCAN_CHUNK):
        payload = kombu_wire.task_payload(envelope)
        if payload and payload.get("run") == run:
            rows[payload["dataset"]].add(payload["row"])
    return rows
