"""`genfleet enqueue --dry-run`: the whole enqueue pass (read, template, partition, reject, encode)
with a destination that keeps nothing. It never connects to Redis, so it cannot change any state;
it reports every row as new, whatever a run has already enqueued."""
from __future__ import annotations

from typing import Any

from celery import Celery

from genfleet.common.kombu_wire import TaskMessageEncoder
from genfleet.common.queues import QUEUES, SERIALIZATION
from genfleet.common.run_state import OutgoingTask, RowRejection
from genfleet.producer.publisher import PublishResult

# What Redis spends beyond the message bytes: list-node headers and allocator size classes. Measured
# on redis 7 with 0.3-30 KB messages: 3-15 % more, depending on how sizes meet jemalloc's classes.
MEMORY_OVERHEAD_RATIO = 1.08
ENTRY_OVERHEAD_BYTES = 16

class DryRunDestination:
    def __init__(self) -> None:
        # Encoding builds the same bytes a real run would push; the app never opens a connection.
        app = Celery("genfleet-dry-run", broker="memory://", set_as_current=False)
        app.conf.update(**SERIALIZATION, task_queues=QUEUES)
        self.encoder = TaskMessageEncoder(app)

    def claims(self, dataset: str, rows: list[int]) -> tuple[set[int], set[int]]:
        return set(), set()

    def encode(self, row: int, partition: str, payload: dict[str, Any], argsrepr: str) -> OutgoingTask:
        _task_id, message = self.encoder.encode(payload, partition, argsrepr)
        return OutgoingTask(row, partition, message)

    def publish(self, dataset: str, tasks: list[OutgoingTask], rejections: list[RowRejection]) -> PublishResult:
        result = PublishResult()
        for task in tasks:
            result.published[task.partition] += 1
        return result


def queue_memory_bytes(message_bytes: int, messages: int) -> int:
    """Estimated Redis memory for `messages` queued messages of `message_bytes` bytes in all (±10 %)."""
    return int(message_bytes * MEMORY_OVERHEAD_RATIO) + messages * ENTRY_OVERHEAD_BYTES
