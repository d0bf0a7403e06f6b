"""The Celery contract shared by producer, workers and Flower: queue names, exchanges, task name."""
from __future__ import annotations

from typing import Literal, get_args

from kombu import Exchange, Queue

Partition = Literal["short", "long"]
SHORT: Partition = "short"
LONG: Partition = "long"
PARTITIONS: tuple[Partition, ...] = get_args(Partition)

# Requests in flight per SGLang host, per pool: long prompts hold far more KV cache each.
IN_FLIGHT_PER_HOST = {SHORT: 150, LONG: 32}

# Each pool's Prometheus /metrics port by default: a host runs one worker per pool.
DEFAULT_METRICS_PORTS = {SHORT: 9650, LONG: 9651}

# `enqueue` keeps each queue at most this deep by default (`--max-queue-depth`): the slots of a
# 100-host fleet, i.e. one prompt per stream of a 100-host fleet is waiting (minutes of work, as each
# stream takes minutes) while Redis holds a bounded amount: a queued message is ~1.4 KB plus ~14 bytes
# per prompt token (docs/running.md), so ~0.2-0.4 GB short and ~0.3-1.2 GB long at typical lengths.
QUEUE_DEPTH_HOSTS = 100
DEFAULT_QUEUE_DEPTH: dict[str, int] = {pool: slots * QUEUE_DEPTH_HOSTS for pool, slots in IN_FLIGHT_PER_HOST.items()}

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
