"""Publishes a run's encoded tasks: the publishing policy (batches, queue-depth backpressure, queue
declaration) around `RunState.publish`, which publishes a batch and marks it enqueued in one atomic
step. A producer killed at any instant has either published and marked a batch, or neither: a re-run
enqueues exactly the rest.

`--max-queue-depth` splits a batch to what fits and waits for the workers; each part is one atomic
`RunState.publish`, marking exactly what it published.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import redis
from celery import Celery

from genfleet.common.keys import celery_event_channel, queue_list
from genfleet.common.kombu_wire import EVENT_ROUTING_KEY, TaskMessageEncoder
from genfleet.common.queues import PARTITIONS, QUEUES, SERIALIZATION
from genfleet.common.run_state import OutgoingTask, RowRejection, RunState

WAIT_POLL_S = 0.2


@dataclass
class PublishResult:
    published: dict[str, int] = field(default_factory=lambda: {p: 0 for p in PARTITIONS})
    # Rows found enqueued or done only at publish time (another producer got there first).
    claimed: int = 0
    new_rejections: int = 0


# Called while waiting for room: (queue, its depth, the limit).
WaitCallback = Callable[[str, int, int], None]


class TaskPublisher:
    """Publishes one run's tasks (an enqueue `Destination`)."""

    def __init__(self, redis_url: str, client: redis.Redis, run: str, *,
                 max_queue_depth: int | Mapping[str, int] = 0, events: bool = True,
                 on_wait: WaitCallback | None = None) -> None:
        self.redis = client
        self.state = RunState(client, run)
        # Per queue (an int: the same for every queue); 0: no limit.
        self.max_queue_depth: dict[str, int] = (dict(max_queue_depth) if isinstance(max_queue_depth, Mapping)
                                else dict.fromkeys(PARTITIONS, max_queue_depth))
        self.on_wait = on_wait
        db = int(client.connection_pool.connection_kwargs.get("db", 0))
        self.event_channel = celery_event_channel(db, EVENT_ROUTING_KEY) if events else ""
        self.app = _producer_app(redis_url)
        self.encoder = TaskMessageEncoder(self.app)
        self._declare_queues()

    def encode(self, row: int, partition: str, payload: dict, argsrepr: str) -> OutgoingTask:
        task_id, message = self.encoder.encode(payload, partition, argsrepr)
        event = self.encoder.encode_sent_event(task_id, partition, argsrepr) if self.event_channel else b""
        return OutgoingTask(row, partition, message, event)

    def claims(self, dataset: str, rows: list[int]) -> tuple[set[int], set[int]]:
        return self.state.row_claims(dataset, rows)

    def publish(self, dataset: str, tasks: list[OutgoingTask], rejections: list[RowRejection]) -> PublishResult:
        """Publishes every task not enqueued or done yet, and records the rejections; waits while a
        queue is at `max_queue_depth`. Each `RunState.publish` is atomic; a batch split to fit the
        queue depth is several calls, each marking exactly what it published."""
        result = PublishResult()
        waiting = {p: [t for t in tasks if t.partition == p] for p in PARTITIONS}
        unrecorded = rejections
        while True:
            chunk: list[OutgoingTask] = []
            for partition, left in waiting.items():
                room = self._room(partition, len(left))
                chunk += left[:room]
                waiting[partition] = left[room:]
            if chunk or unrecorded:
                self._run(dataset, chunk, unrecorded, result)
                unrecorded = []
            if not any(waiting.values()):
                return result
            if not chunk:
                self._wait([p for p, left in waiting.items() if left])

    def queue_depth(self, partition: str) -> int:
        return int(self.redis.llen(queue_list(partition)))

    def close(self) -> None:
        self.app.close()

    def _room(self, partition: str, wanted: int) -> int:
        limit = self.max_queue_depth.get(partition, 0)
        if not wanted or not limit:
            return wanted
        return max(0, min(wanted, limit - self.queue_depth(partition)))

    def _wait(self, partitions: list[str]) -> None:
        if self.on_wait is not None:
            for partition in partitions:
                self.on_wait(partition, self.queue_depth(partition), self.max_queue_depth.get(partition, 0))
        time.sleep(WAIT_POLL_S)

    def _run(self, dataset: str, tasks: list[OutgoingTask], rejections: list[RowRejection],
             result: PublishResult) -> None:
        published = self.state.publish(dataset, tasks, rejections, queues=PARTITIONS,
                                       event_channel=self.event_channel)
        for partition, count in published.pushed.items():
            result.published[partition] += count
        result.claimed += published.claimed
        result.new_rejections += published.new_rejections

    def _declare_queues(self) -> None:
        """The exchange bindings kombu routes by: workers declare them too, but a task re-published
        through kombu (a retry, a requeue) before any worker started would be dropped without them."""
        with self.app.connection_for_write() as connection:
            channel = connection.default_channel
            for queue in QUEUES:
                queue(channel).declare()


def _producer_app(redis_url: str) -> Celery:
    app = Celery("genfleet-producer", broker=redis_url, set_as_current=False)
    # Only what publishing needs; the workers' behaviour lives in workers/lifecycle.py.
    app.conf.update(**SERIALIZATION, task_queues=QUEUES, task_create_missing_queues=False,
                    task_send_sent_event=True)
    return app
