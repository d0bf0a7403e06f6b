"""A worker's telemetry: its beacon for `status` and its Prometheus metrics.

A worker's Prometheus metrics and the HTTP server that exposes them on `/metrics`.

Counters and histograms are fed by the task (a prompt finished, an attempt failed) and by task
start/end; gauges that describe shared state (queue depth, unacked messages, upstream health,
requests per upstream) are read when Prometheus scrapes, so they are never stale.

What a worker reports about its work besides the shards: rate buckets and length histograms in
Redis (for `genfleet status`), Prometheus metrics (`/metrics`), and a beacon with its upstreams'
health and its tasks in flight.

The task calls `completed` and `failed`; `lifecycle` feeds Celery's task start/end to `IN_FLIGHT`,
calls `start` when the worker is ready and `stop` when it shuts down. None of it may fail a task:
the record is already durable when these run, so a lost sample is only logged.
"""
from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import redis
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from genfleet.common import fleet_stats
from genfleet.common.keys import KOMBU_UNACKED, queue_list
from genfleet.common.queues import DEFAULT_METRICS_PORTS, GENERATE_TASK, PARTITIONS
from genfleet.common.records import CompletionRecord, TaskPayload
from genfleet.common.run_state import created_at
from genfleet.workers.admission import streams
from genfleet.workers.errors import GenerationError, IntegrityError
from genfleet.workers.runtime import WorkerRuntime

log = logging.getLogger(__name__)

# Up to an hour: a long-partition prompt can queue behind a full server and decode for many minutes.
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600)
DURATION_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 900, 1200, 1800, 2700, 3600)
LENGTH_BUCKETS = (16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


class WorkerMetrics:
    """The metric objects of one worker process, in their own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        per_prompt = ["run", "dataset", "partition", "upstream"]
        self.completion_tokens = Counter("genfleet_completion_tokens", "Completion tokens generated",
                                         per_prompt, registry=r)
        self.reasoning_tokens = Counter("genfleet_reasoning_tokens",
                                        "Completion tokens that were reasoning", per_prompt, registry=r)
        self.prompt_tokens = Counter("genfleet_prompt_tokens", "Prompt tokens of finished prompts",
                                     per_prompt, registry=r)
        self.completions = Counter("genfleet_completions", "Prompts finished and written, by finish reason",
                                   [*per_prompt, "finish_reason"], registry=r)
        # The loop guard and truncation handling, per prompt (exported with the _total suffix).
        self.loops = Counter("genfleet_loops", "Completions the loop guard stopped or flagged as a degenerate "
                             "repetition (finish_reason loop)", per_prompt, registry=r)
        self.loop_tokens = Counter("genfleet_loop_tokens", "Completion tokens of the looped completions",
                                   per_prompt, registry=r)
        self.continuations = Counter("genfleet_continuations", "Completions continued past a max_new_tokens cut "
                                     "by follow-up requests", per_prompt, registry=r)
        self.errors = Counter("genfleet_errors", "Failed attempts by error type and class "
                              "(transient: retried; permanent, exhausted or integrity: dead-lettered)",
                              ["run", "dataset", "partition", "error", "error_class"], registry=r)
        # Exported as genfleet_integrity_failures_total (prometheus_client appends _total to counters).
        self.integrity_failures = Counter(
            "genfleet_integrity_failures", "Attempts whose stream failed the integrity check (nothing written)",
            ["run", "dataset", "upstream"], registry=r)
        self.tasks_in_flight = Gauge("genfleet_tasks_in_flight", "Tasks executing on this worker",
                                     ["run", "dataset", "partition"], registry=r)
        self.time_to_first_token = Histogram(
            "genfleet_time_to_first_token_seconds", "From request sent to first streamed token",
            ["dataset", "partition"], buckets=TTFT_BUCKETS, registry=r)
        self.duration = Histogram("genfleet_request_duration_seconds",
                                  "From task start to record written (all turns)",
                                  ["dataset", "partition"], buckets=DURATION_BUCKETS, registry=r)
        self.completion_length = Histogram("genfleet_completion_length_tokens", "Completion tokens per prompt",
                                           ["dataset", "partition"], buckets=LENGTH_BUCKETS, registry=r)
        self.slots = Gauge("genfleet_worker_slots", "Tasks this worker runs at once (its concurrency)",
                           ["pool"], registry=r)
        ProcessCollector(registry=r)  # RSS and CPU: the target is <= 400 MB per worker at 150 streams
        PlatformCollector(registry=r)
        GCCollector(registry=r)


class FleetCollector(Collector):
    """Read at scrape time: queue depth and unacked messages (fleet-wide, the same from every worker:
    aggregate with max), and this worker's view of its upstreams."""

    def __init__(self, client: redis.Redis, upstreams: Callable[[], list[fleet_stats.UpstreamHealth]],
                 first_caps: Callable[[], dict[tuple[str, str], int]] = dict) -> None:
        self.redis = client
        self.upstreams = upstreams  # () -> each upstream as this worker sees it
        self.first_caps = first_caps  # () -> (run, dataset) -> the `auto` first cap asked now

    def collect(self) -> Iterator[Metric]:
        yield from upstream_metrics(self.upstreams())
        first_cap = GaugeMetricFamily("genfleet_first_max_new_tokens", "The max_new_tokens this worker's first "
                                      "requests ask (--first-max-new-tokens auto)", labels=["run", "dataset"])
        for (run, dataset), cap in self.first_caps().items():
            first_cap.add_metric([run, dataset], cap)
        yield first_cap
        try:
            pipe = self.redis.pipeline(transaction=False)
            for queue in PARTITIONS:
                pipe.llen(queue_list(queue))
            pipe.hlen(KOMBU_UNACKED)
            *depths, unacked = pipe.execute()
        except redis.RedisError as error:  # a scrape must not fail because Redis restarts
            log.warning("metrics: could not read queue depths: %s", error)
            return
        queue_depth = GaugeMetricFamily("genfleet_queue_depth", "Messages waiting in each queue (all runs)",
                                        labels=["queue"])
        for queue, depth in zip(PARTITIONS, depths, strict=True):
            queue_depth.add_metric([queue], depth)
        yield queue_depth
        yield GaugeMetricFamily("genfleet_unacked_messages",
                                "Messages delivered to workers and not yet acknowledged (all runs)", value=unacked)


# The host's own load (SGLang's /v1/loads, vLLM's /metrics: workers/servers/), as the worker last
# read it: one family per field.
_LOAD_GAUGES = (
    ("genfleet_upstream_running_requests", "Requests the server is running (all its clients)", "running"),
    ("genfleet_upstream_waiting_requests", "Requests waiting in the server's queue", "waiting"),
    ("genfleet_upstream_token_usage", "Share of the server's KV cache in use", "token_usage"),
    ("genfleet_upstream_retracted_requests", "Requests the server retracted (SGLang: at its last retraction; "
     "vLLM: preempted since the reading before)", "retracted"),
    ("genfleet_upstream_gen_throughput", "The server's decode tokens/s", "gen_throughput"),
)


def upstream_metrics(view: list[fleet_stats.UpstreamHealth]) -> Iterator[Metric]:
    requests = GaugeMetricFamily("genfleet_requests_in_flight", "Requests streaming from each upstream",
                                 labels=["upstream"])
    up = GaugeMetricFamily("genfleet_upstream_up", "1 while the upstream's circuit is closed", labels=["upstream"])
    target = GaugeMetricFamily("genfleet_in_flight_target", "This worker's in-flight target for the upstream "
                               "(--in-flight auto)", labels=["upstream"])
    bound = GaugeMetricFamily("genfleet_upstream_admission_bound", "1 while many requests wait at low KV use: "
                              "the caps reserve the KV cache", labels=["upstream"])
    loads = [GaugeMetricFamily(name, text, labels=["upstream"]) for name, text, _ in _LOAD_GAUGES]
    for upstream in view:
        requests.add_metric([upstream.url], upstream.in_flight)
        up.add_metric([upstream.url], 1.0 if upstream.healthy else 0.0)
        if upstream.target is not None:
            target.add_metric([upstream.url], upstream.target)
        if upstream.load is not None:
            bound.add_metric([upstream.url], float(upstream.load.admission_bound()))
            for family, (_, _, field_name) in zip(loads, _LOAD_GAUGES, strict=True):
                family.add_metric([upstream.url], float(getattr(upstream.load, field_name)))
    yield from (requests, up, target, bound, *loads)


METRICS = WorkerMetrics()


def serve(port: int, registry: CollectorRegistry = METRICS.registry, address: str = "0.0.0.0") -> bool:
    """Starts /metrics in a daemon thread. A busy port costs the metrics, never the worker."""
    try:
        start_http_server(port, addr=address, registry=registry)
    except OSError as error:
        log.warning("Prometheus metrics not served: port %d: %s (set --metrics-port)", port, error)
        return False
    log.info("Prometheus metrics on http://%s:%d/metrics", address, port)
    return True




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


def failed(runtime: WorkerRuntime, payload: TaskPayload, error: GenerationError, verdict: str) -> None:
    """A failed attempt, with the failure policy's verdict on it (`workers/failures.py`): transient
    (tried again) or its dead-letter class."""
    METRICS.errors.labels(payload.run, payload.dataset, payload.partition, type(error).__name__, verdict).inc()
    if isinstance(error, IntegrityError):
        METRICS.integrity_failures.labels(payload.run, payload.dataset, error.upstream or "unknown").inc()
    try:
        fleet_stats.record_failure(runtime.run_state(payload.run).redis, payload.run, payload.dataset,
                                   payload.partition)
    except redis.RedisError as redis_error:
        log.warning("failure of %s not recorded: %s", payload.id, redis_error)


class InFlight:
    """Tasks executing in this process, per run, dataset and partition: for the beacon and the gauge."""

    def __init__(self) -> None:
        self._counts: collections.Counter[tuple[str, str, str]] = collections.Counter()
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
        # Each run this worker has taken prompts of -> when its manifest says it was created.
        self._created: dict[str, str] = {}
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
        first_caps: dict[str, dict[str, int]] = {}
        for (run, dataset), cap in self.runtime.first_caps.current().items():
            first_caps.setdefault(run, {})[dataset] = cap
        fleet_stats.publish(self.redis, fleet_stats.WorkerBeacon(
            name=self.runtime.name, pool=self.pool, slots=self.slots, time=self.runtime.leases.clock.now(),
            upstreams=upstream_view(self.runtime), in_flight=IN_FLIGHT.by_run(),
            disk_problem=self.runtime.disk.problem(), first_caps=first_caps,
            clock_offset_s=self.runtime.leases.clock.offset_s(), lost_runs=self.lost_runs(),
        ))

    def lost_runs(self) -> list[str]:
        """Runs whose state Redis lost since this worker saw them: a manifest it read once is gone (a
        restart without AOF, a failover, a flush). `status` raises the alarm from the beacon, which
        outlives the loss; it clears once the run has a manifest again (re-enqueued)."""
        runs = self.runtime.runs()
        if not runs:
            return []
        lost = []
        for run, created in zip(runs, created_at(self.redis, runs), strict=True):
            if created is not None:
                self._created[run] = created
            elif run in self._created:
                lost.append(run)
        return lost

    def _loop(self) -> None:
        while True:
            try:
                self.publish_once()
            except redis.RedisError as error:
                log.warning("beacon not published: %s", error)
            if self._stop.wait(fleet_stats.BEACON_INTERVAL_S):
                return


def upstream_view(runtime: WorkerRuntime) -> list[fleet_stats.UpstreamHealth]:
    """Each upstream as this worker sees it: health, streams open, and with `--in-flight auto` its
    target and the host's last load reading."""
    pool = runtime.upstreams
    in_flight, healthy = pool.in_flight(), set(pool.healthy())
    admission = runtime.admission.snapshot() if runtime.admission is not None else {}
    view = []
    for url, count in in_flight.items():
        host = admission.get(url)
        view.append(fleet_stats.UpstreamHealth(
            url, url in healthy, count, target=streams(host.target) if host is not None else None,
            load=host.load if host is not None else None))
    return view


def start(runtime: WorkerRuntime) -> Beacon:
    """When the worker is ready: the beacon (returned, for `stop`), and /metrics unless its port is 0."""
    pool, slots = runtime.settings.pool, runtime.settings.in_flight()
    beacon = Beacon(runtime.redis, runtime, pool, slots)
    beacon.start()
    METRICS.slots.labels(pool).set(slots)
    port = runtime.settings.metrics_port
    port = DEFAULT_METRICS_PORTS.get(pool, 0) if port is None else port
    if port:
        METRICS.registry.register(FleetCollector(runtime.redis, lambda: upstream_view(runtime),
                                                 runtime.first_caps.current))
        serve(port)
    return beacon
