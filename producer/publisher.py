"""Publishes task payloads onto the Celery queues without importing the workers' code."""
from __future__ import annotations

from celery import Celery

from common.queues import GENERATE_TASK, QUEUES, SERIALIZATION
from common.records import TaskPayload


class TaskPublisher:
    def __init__(self, redis_url: str) -> None:
        self.app = Celery("genfleet-producer", broker=redis_url, set_as_current=False)
        # Only what publishing needs; the workers' behaviour lives in workers/app.py.
        self.app.conf.update(**SERIALIZATION, task_queues=QUEUES, task_create_missing_queues=False,
                             task_send_sent_event=True)

    def publish(self, payloads: list[TaskPayload]) -> None:
        with self.app.producer_or_acquire() as producer:
            for payload in payloads:
                self.app.send_task(
                    GENERATE_TASK, args=[payload.to_dict()], queue=payload.partition,
                    producer=producer,
                    # What Flower shows: the id and size, never the whole prompt.
                    argsrepr=f"{payload.id} {payload.partition} {payload.prompt_tokens} prompt tokens",
                    kwargsrepr="{}",
                )

    def close(self) -> None:
        self.app.close()
