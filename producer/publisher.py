"""Publishes a batch of encoded tasks and marks them enqueued in one atomic step, so a producer killed
at any instant has either published and marked a batch, or neither: a re-run enqueues exactly the rest.

One Lua script per batch (one round trip, atomic in Redis) does, per task: skip it if its row is done
or already enqueued (SETBIT returns the old bit, which also makes two producers racing on one run
safe), else LPUSH it onto its queue the way kombu's Redis transport does, publish its `task-sent`
event, and forget an old rejection of the row; then it records the batch's rejections and bumps the
dataset's counters. `--max-queue-depth` splits a batch to what fits and waits for the workers.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
from celery import Celery

from common.keys import celery_event_channel, queue_list
from common.queues import PARTITIONS, QUEUES, SERIALIZATION
from common.run_state import RunState
from producer.task_message import EVENT_ROUTING_KEY, TaskMessageEncoder

WAIT_POLL_S = 0.2

# KEYS: enqueued bitmap, done bitmap, counters hash, rejected hash, then one list per partition.
# ARGV: tasks, rejections, event channel ('' for none), then per task (row, partition number,
# message, event), then per rejection (row, JSON entry).
_PUBLISH_BODY = """
local tasks, rejections, channel = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local pushed, claimed, unrejected = {}, 0, 0
for q = 1, #KEYS - 4 do pushed[q] = 0 end
local i = 4
for _ = 1, tasks do
  local row = ARGV[i]
  if redis.call('GETBIT', KEYS[2], row) == 1 or redis.call('SETBIT', KEYS[1], row, 1) == 1 then
    claimed = claimed + 1
  else
    local q = tonumber(ARGV[i + 1])
    redis.call('LPUSH', KEYS[4 + q], ARGV[i + 2])
    pushed[q] = pushed[q] + 1
    if channel ~= '' then redis.call('PUBLISH', channel, ARGV[i + 3]) end
    unrejected = unrejected + redis.call('HDEL', KEYS[4], row)
  end
  i = i + 4
end
local rejected = 0
for _ = 1, rejections do
  rejected = rejected + redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1])
  i = i + 2
end
local total = 0
for q = 1, #pushed do total = total + pushed[q] end
if total > 0 then redis.call('HINCRBY', KEYS[3], 'total', total) end
if rejected ~= unrejected then redis.call('HINCRBY', KEYS[3], 'rejected', rejected - unrejected) end
pushed[#pushed + 1] = claimed
pushed[#pushed + 1] = rejected
return pushed
"""
# Redis 7 checks a flagged script for out-of-memory before it starts, never half-way through:
# without the flag line an OOM error could stop the script after some of its writes.
_PUBLISH_FLAGGED = "#!lua\n" + _PUBLISH_BODY


@dataclass(frozen=True, slots=True)
class OutgoingTask:
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

    def __init__(self, redis_url: str, client: redis.Redis, run: str, *, max_queue_depth: int = 0,
                 events: bool = True, on_wait: WaitCallback | None = None) -> None:
        self.redis = client
        self.state = RunState(client, run)
        self.keys = self.state.keys
        self.max_queue_depth = max_queue_depth
        self.on_wait = on_wait
        db = int(client.connection_pool.connection_kwargs.get("db", 0))
        self.event_channel = celery_event_channel(db, EVENT_ROUTING_KEY) if events else ""
        self.app = _producer_app(redis_url)
        self.encoder = TaskMessageEncoder(self.app)
        version = tuple(int(part) for part in str(client.info("server")["redis_version"]).split(".")[:2])
        self._script = client.register_script(_PUBLISH_FLAGGED if version >= (7, 0) else _PUBLISH_BODY)
        self._declare_queues()

    def encode(self, row: int, partition: str, payload: dict, argsrepr: str) -> OutgoingTask:
        task_id, message = self.encoder.encode(payload, partition, argsrepr)
        event = self.encoder.encode_sent_event(task_id, partition, argsrepr) if self.event_channel else b""
        return OutgoingTask(row, partition, message, event)

    def claims(self, dataset: str, rows: list[int]) -> tuple[set[int], set[int]]:
        return self.state.row_claims(dataset, rows)

    def publish(self, dataset: str, tasks: list[OutgoingTask], rejections: list[RowRejection]) -> PublishResult:
        """Publishes every task not enqueued or done yet, and records the rejections; waits while a
        queue is at `max_queue_depth`. Each call of the script is atomic; a batch split to fit the
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
        if not wanted or not self.max_queue_depth:
            return wanted
        return max(0, min(wanted, self.max_queue_depth - self.queue_depth(partition)))

    def _wait(self, partitions: list[str]) -> None:
        if self.on_wait is not None:
            for partition in partitions:
                self.on_wait(partition, self.queue_depth(partition), self.max_queue_depth)
        time.sleep(WAIT_POLL_S)

    def _run(self, dataset: str, tasks: list[OutgoingTask], rejections: list[RowRejection],
             result: PublishResult) -> None:
        keys = self.keys
        args: list[int | str | bytes] = [len(tasks), len(rejections), self.event_channel]
        number = {p: i for i, p in enumerate(PARTITIONS, start=1)}
        for task in tasks:
            args += (task.row, number[task.partition], task.message, task.event)
        for rejection in rejections:
            args += (rejection.row, rejection.entry())
        script_keys = [keys.enqueued(dataset), keys.done(dataset), keys.counters(dataset),
                       keys.rejected(dataset), *(queue_list(p) for p in PARTITIONS)]
        reply = self._script(keys=script_keys, args=args)
        for partition, count in zip(PARTITIONS, reply, strict=False):
            result.published[partition] += int(count)
        result.claimed += int(reply[len(PARTITIONS)])
        result.new_rejections += int(reply[len(PARTITIONS) + 1])

    def _declare_queues(self) -> None:
        """The exchange bindings kombu routes by: workers declare them too, but a task re-published
        through kombu (a retry, a requeue) before any worker started would be dropped without them."""
        with self.app.connection_for_write() as connection:
            channel = connection.default_channel
            for queue in QUEUES:
                queue(channel).declare()


def _producer_app(redis_url: str) -> Celery:
    app = Celery("genfleet-producer", broker=redis_url, set_as_current=False)
    # Only what publishing needs; the workers' behaviour lives in workers/app.py.
    app.conf.update(**SERIALIZATION, task_queues=QUEUES, task_create_missing_queues=False,
                    task_send_sent_event=True)
    return app
