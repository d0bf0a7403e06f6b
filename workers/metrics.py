"""A worker's Prometheus metrics and the HTTP server that exposes them on `/metrics`.

Counters and histograms are fed by the task (a prompt finished, an attempt failed) and by task
start/end; gauges that describe shared state (queue depth, unacked messages, upstream health,
requests per upstream) are read when Prometheus scrapes, so they are never stale.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

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

from genfleet.common.keys import KOMBU_UNACKED, queue_list
from genfleet.common.queues import LONG, PARTITIONS, SHORT

log = logging.getLogger(__name__)

# Each host runs one worker per pool, so each pool gets its own default port.
DEFAULT_PORTS = {SHORT: 9650, LONG: 9651}

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

    def __init__(self, client: redis.Redis, upstreams: Callable[[], tuple[dict[str, int], list[str]]]) -> None:
        self.redis = client
        self.upstreams = upstreams  # () -> (in flight per upstream, healthy upstreams)

    def collect(self) -> Iterator[Metric]:
        in_flight, healthy = self.upstreams()
        requests = GaugeMetricFamily("genfleet_requests_in_flight", "Requests streaming from each upstream",
                                     labels=["upstream"])
        up = GaugeMetricFamily("genfleet_upstream_up", "1 while the upstream's circuit is closed",
                               labels=["upstream"])
        for url, count in in_flight.items():
            requests.add_metric([url], count)
            up.add_metric([url], 1.0 if url in healthy else 0.0)
        yield requests
        yield up
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
