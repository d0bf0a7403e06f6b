"""The Celery contract shared by producer, workers and Flower: queue names, exchanges, task name."""
from __future__ import annotations

from kombu import Exchange, Queue

SHORT = "short"
LONG = "long"
PARTITIONS = (SHORT, LONG)

# Requests in flight per SGLang host, per pool: long prompts hold far more KV cache each.
IN_FLIGHT_PER_HOST = {SHORT: 150, LONG: 32}

GENERATE_TASK = "genfleet.generate"

# Each queue gets its own direct exchange: sharing the default one would route both keys alike.
QUEUES = tuple(Queue(name, Exchange(name, type="direct"), routing_key=name) for name in PARTITIONS)

# Settings every app that talks to the broker must share (producer, workers, Flower).
SERIALIZATION = {
    "task_serializer": "msgpack",
    "result_serializer": "msgpack",
    "accept_content": ["msgpack"],
    "event_serializer": "json",
}
