"""What a worker reports about its work besides the shards: rate buckets and length histograms in
Redis (for `genfleet status`), Prometheus metrics (`/metrics`), and a beacon with its upstreams'
health and its tasks in flight.

The task calls `completed` and `failed`; `lifecycle` feeds Celery's task start/end to `IN_FLIGHT`,
calls `start` when the worker is ready and `stop` when it shuts down. None of it may fail a task:
the record is already durable when these run, so a lost sample is only logged.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any

import redis

from genfleet.common import fleet_stats
from genfleet.common.queues import GENERATE_TASK
from genfleet.common.records import CompletionRecord, TaskPayload
from genfleet.common.run_state import PERMANENT, TRANSIENT
from genfleet.workers.errors import GenerationError, IntegrityError
from genfleet.workers.metrics import DEFAULT_PORTS, METRICS, FleetCollector, serve
from genfleet.workers.runtime import WorkerRuntime

log = logging.getLogger(__name__)


def completed(runtime: WorkerRuntime, payload: TaskPayload, record: CompletionRecord) -> None:
    """A prompt's record is on disk and its row settled for the first time: count it in the
    Prometheus metrics (its Redis rates went with the done bit: `completion_updates`)."""
    labels = (payload.run, payload.dataset, payload.partition, record.upstream)
    METRICS.completion_tokens.labels(*labels).inc(record.usage.completion_tokens)
    METRICS.reasoning_tokens.labels(*labels).inc(record.usage.reasoning_tokens)
    METRICS.prompt_tokens.labels(*labels).inc(record.usage.prompt_tokens)
    METRICS.completions.labels(*labels, record.finish_reason).inc()
    looped = record.loop is not None or record.finish_reason == "loop"
    # Added to on every completion, by 0 when nothing happened: a series that exists from the first
    # completion lets rate() see the first loop (a series born at 1 hides its first increment).
    METRICS.loops.labels(*labels).inc(int(looped))
    METRICS.loop_tokens.labels(*labels).inc(record.usage.completion_tokens if looped else 0)
    METRICS.continuations.labels(*labels).inc(int(bool(record.continued)))
    where = (payload.dataset, payload.partition)
    if record.timing.first_token_s is not None:
        METRICS.time_to_first_token.labels(*where).observe(record.timing.first_token_s)
    METRICS.duration.labels(*where).observe(record.timing.duration_s)
    METRICS.completion_length.labels(*where).observe(record.usage.completion_tokens)


def completion_updates(payload: TaskPayload, record: CompletionRecord) -> list[fleet_stats.KeyUpdate]:
    """The finished prompt's rates and length for `status`, applied with its done bit (one round
    trip, once per row: `RunState.mark_done`)."""
    return fleet_stats.completion_updates(payload.run, payload.dataset, payload.partition,
                                    record.usage.completion_tokens, record.timing.duration_s)


def failed(runtime: WorkerRuntime, payload: TaskPayload, error: GenerationError) -> None:
    """A failed attempt, whether it will be retried or dead-lettered."""
    METRICS.errors.labels(payload.run, payload.dataset, payload.partition, type(error).__name__,
                          outcome_class(error, payload.attempt, runtime.settings.max_attempts)).inc()
    if isinstance(error, IntegrityError):
        METRICS.integrity_failures.labels(payload.run, payload.dataset, error.upstream or "unknown").inc()
    try:
        fleet_stats.record_failure(runtime.run_state(payload.run).redis, payload.run, payload.dataset,
                                   payload.partition)
    except redis.RedisError as redis_error:
        log.warning("failure of %s not recorded: %s", payload.id, redis_error)


def outcome_class(error: GenerationError, attempt: int, max_attempts: int) -> str:
    """transient (will be retried), or the dead-letter class: permanent, exhausted or integrity."""
    if not error.retryable:
        return PERMANENT
    return TRANSIENT if attempt < max_attempts else error.exhausted_class


class InFlight:
    """Tasks executing in this process, per run, dataset and partition: for the beacon and the gauge."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[str, str, str]] = Counter()
        self._lock = threading.Lock()

    def change(self, key: tuple[str, str, str], delta: int) -> None:
        with self._lock:
            self._counts[key] += delta
            if self._counts[key] <= 0:
                del self._counts[key]
        METRICS.tasks_in_flight.labels(*key).inc(delta)

    def by_run(self) -> dict[str, dict[str, int]]:
        """run -> "partition:dataset" -> count (the beacon's shape)."""
        with self._lock:
            out: dict[str, dict[str, int]] = {}
            for (run, dataset, partition), count in self._counts.items():
                out.setdefault(run, {})[f"{partition}:{dataset}"] = count
            return out


IN_FLIGHT = InFlight()


def task_key(task: Any, args: Any) -> tuple[str, str, str] | None:
    """(run, dataset, partition) of a generate task, from its payload; None for any other task."""
    if getattr(task, "name", None) != GENERATE_TASK or not args or not isinstance(args[0], dict):
        return None
    payload = args[0]
    return str(payload.get("run")), str(payload.get("dataset")), str(payload.get("partition"))


class Beacon:
    """Publishes this worker's upstream health and tasks in flight every few seconds, with a TTL."""

    def __init__(self, client: redis.Redis, runtime: WorkerRuntime, pool: str, slots: int) -> None:
        self.redis, self.runtime, self.pool, self.slots = client, runtime, pool, slots
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="telemetry-beacon", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        try:
            fleet_stats.withdraw(self.redis, self.runtime.name)
        except redis.RedisError:
            pass  # it expires anyway

    def publish_once(self) -> None:
        pool = self.runtime.upstreams
        in_flight, healthy = pool.in_flight(), set(pool.healthy())
        fleet_stats.publish(self.redis, fleet_stats.WorkerBeacon(
            name=self.runtime.name, pool=self.pool, slots=self.slots, time=time.time(),
            upstreams=[fleet_stats.UpstreamHealth(url, url in healthy, count) for url, count in in_flight.items()],
            in_flight=IN_FLIGHT.by_run(), disk_problem=self.runtime.disk.problem(),
        ))

    def _loop(self) -> None:
        while True:
            try:
                self.publish_once()
            except redis.RedisError as error:
                log.warning("beacon not published: %s", error)
            if self._stop.wait(fleet_stats.BEACON_INTERVAL_S):
                return


def start(runtime: WorkerRuntime) -> Beacon:
    """When the worker is ready: the beacon (returned, for `stop`), and /metrics unless its port is 0."""
    pool, slots = runtime.settings.pool, runtime.settings.in_flight()
    beacon = Beacon(runtime.redis, runtime, pool, slots)
    beacon.start()
    METRICS.slots.labels(pool).set(slots)
    port = runtime.settings.metrics_port
    port = DEFAULT_PORTS.get(pool, 0) if port is None else port
    if port:
        METRICS.registry.register(FleetCollector(runtime.redis, lambda: (runtime.upstreams.in_flight(),
                                                                         runtime.upstreams.healthy())))
        serve(port)
    return beacon
