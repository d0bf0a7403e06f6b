"""Celery task messages as the producer encodes them, and one held by a consumer the way a worker
holds it (kombu's own `basic_get`: in `unacked` and its index until acknowledged)."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import redis
from celery import Celery
from kombu import Connection
from kombu.message import Message

from genfleet.common import kombu_wire
from genfleet.common.queues import QUEUES, SERIALIZATION, SHORT


def encoder() -> kombu_wire.TaskMessageEncoder:
    """The producer's encoder, on an app with genfleet's queues and serialisation (no broker)."""
    app = Celery("wire-test", broker="memory://", set_as_current=False)
    app.conf.update(**SERIALIZATION, task_queues=QUEUES)
    return kombu_wire.TaskMessageEncoder(app)


@contextmanager
def held_message(client: redis.Redis, redis_url: str, payload: dict, queue: str = SHORT) -> Iterator[Message]:
    """Queues `payload` and fetches it unacknowledged with kombu, as a worker would; yields the
    message while the consumer's connection stays open (closing it would give the message back)."""
    _task_id, raw = encoder().encode(payload, queue, payload.get("id", "task"))
    client.lpush(queue, raw)
    with Connection(redis_url) as connection:
        yield connection.default_channel.basic_get(queue, no_ack=False)
