"""What a worker process shares across its task threads: settings, the HTTP client, the upstream
pool, the shard writers and the run state. Built once from the worker's `Settings`, closed on
worker shutdown; the task and the signal handlers receive it, nothing looks it up globally."""
from __future__ import annotations

import contextlib
import os
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

import redis
from celery.worker import state as celery_state

from genfleet.common.queues import IN_FLIGHT_PER_HOST
from genfleet.common.run_state import RunState, connect
from genfleet.common.settings import Settings
from genfleet.common.tokenizer import load_tokenizer
from genfleet.workers.admission import AdmissionControl
from genfleet.workers.delivery import LeaseKeeper, Reaper
from genfleet.workers.generation.client import SglangClient
from genfleet.workers.generation.first_cap import FirstCaps
from genfleet.workers.generation.split import CompletionSplitter
from genfleet.workers.output import DiskGuard, ShardSet
from genfleet.workers.upstreams import UpstreamPool

# Threads beyond the in-flight cap: while one thread fsyncs its record, acks and fetches the next
# task, a spare one already holds the next stream, so the server's slots never sit empty.
SPARE_THREADS = 16
# Connections beyond the threads: health probes and /server_info share the client.
SPARE_CONNECTIONS = 16


@dataclass
class WorkerRuntime:
    settings: Settings
    name: str
    client: SglangClient
    upstreams: UpstreamPool
    shards: ShardSet
    tokenizer: Any | None
    splitter: CompletionSplitter
    redis: redis.Redis
    leases: LeaseKeeper
    reaper: Reaper
    disk: DiskGuard
    first_caps: FirstCaps
    # Reads each host's load; with `--in-flight auto` sets its cap from it.
    admission: AdmissionControl | None = None
    # Set when the worker begins to shut down: running streams give their task back to the queue.
    shutdown: threading.Event = field(default_factory=threading.Event)
    _states: dict[str, RunState] = field(default_factory=dict)

    @classmethod
    def build(cls, settings: Settings) -> WorkerRuntime:
        in_flight = settings.in_flight()
        client = SglangClient(max_connections=in_flight + SPARE_THREADS + SPARE_CONNECTIONS,
                              connect_timeout_s=settings.connect_timeout_s, stall_timeout_s=settings.stall_timeout_s)
        upstreams = UpstreamPool(settings.upstreams, per_upstream_cap=per_upstream_cap(settings),
                                 failure_threshold=settings.breaker_failures, open_s=settings.breaker_open_s,
                                 probe_interval_s=settings.health_interval_s, routing=settings.routing)
        # A host whose breaker closes again may have restarted with other settings.
        upstreams.on_recovered = client.forget
        name = f"{settings.pool}-{socket.gethostname()}-{os.getpid()}"
        tokenizer = load_tokenizer(settings.tokenizer) if settings.tokenizer else None
        client_redis = connect(settings.redis_url)
        return cls(
            settings=settings, name=name, client=client, upstreams=upstreams,
            shards=ShardSet(settings.output_dir, name, max_bytes=settings.shard_max_bytes,
                            commit_interval_s=settings.commit_interval_s, max_age_s=settings.shard_max_age_s),
            tokenizer=tokenizer,
            splitter=CompletionSplitter(settings.reasoning_parser, tokenizer,
                                        skip_special_tokens=settings.skip_special_tokens),
            redis=client_redis,
            leases=LeaseKeeper(client_redis, ttl_s=settings.lease_ttl_s, heartbeat_s=settings.lease_heartbeat_s,
                               in_hand=celery_delivery_tags),
            reaper=Reaper(client_redis, ttl_s=settings.lease_ttl_s, interval_s=settings.reaper_interval_s,
                          restart_grace_s=settings.lease_ttl_s,
                          unaccounted_interval_s=settings.unaccounted_check_interval_s),
            disk=DiskGuard(settings.output_dir, min_free_bytes=settings.min_free_disk_mb * 2**20),
            first_caps=FirstCaps(client_redis, settings),
            admission=AdmissionControl(upstreams, ceiling=per_upstream_cap(settings),
                                       start=IN_FLIGHT_PER_HOST[settings.pool],
                                       interval_s=settings.admission_interval_s,
                                       steer=settings.in_flight_mode == "auto"),
        )

    @property
    def threads(self) -> int:
        """Celery's thread count: the requests in flight plus the spare threads."""
        return self.settings.in_flight() + SPARE_THREADS

    def start_background(self) -> None:
        """Lease heartbeat, reaper, upstream health probes and (auto) admission control: run in every
    worker, busy or not."""
        with contextlib.suppress(redis.RedisError):  # read at the first lease otherwise
            self.leases.clock.resync()  # and warns now if this host's clock is off
        self.leases.start()
        self.reaper.start()
        self.upstreams.start_probes()
        if self.admission is not None:
            self.admission.start_thread()

    def runs(self) -> list[str]:
        """The runs this worker has taken prompts of."""
        return list(self._states)

    def run_state(self, run: str) -> RunState:
        state = self._states.get(run)
        if state is None:
            state = self._states.setdefault(run, RunState(self.redis, run))
        return state

    def close(self) -> None:
        self.leases.stop()
        self.reaper.stop()
        self.upstreams.stop_probes()
        if self.admission is not None:
            self.admission.stop()
        self.shards.close()
        self.client.close()


def per_upstream_cap(settings: Settings) -> int:
    """The in-flight cap split evenly over the hosts (rounded up)."""
    hosts = max(len(settings.upstreams), 1)
    return max(-(-settings.in_flight() // hosts), 1)


def celery_delivery_tags() -> set[str] | None:
    """The delivery tags of the messages this process's Celery still means to run: scheduled (a
    countdown retry waiting for its time), reserved or running (celery 5.7 `worker/state.py`:
    `Consumer.on_close` empties the first two when the broker connection drops). A request held in
    a rate-limit bucket is in none of them: no genfleet task has a `rate_limit`. None when the sets
    could not be read (renew every tag held, as before this check; the next beat reads again)."""
    requests = _celery_requests(celery_state.scheduled_requests, celery_state.reserved_requests,
                                celery_state.active_requests)
    return None if requests is None else {tag for request in requests if (tag := _delivery_tag(request))}


def running_delivery_tag(task_id: str) -> str | None:
    """The delivery tag of the running attempt of `task_id`, from `task_postrun`: its request is
    still active then (`task_ready` follows), and a retry that shares the id is not active yet."""
    running = _celery_requests(celery_state.active_requests) or []
    return next((tag for request in running if request.id == task_id and (tag := _delivery_tag(request))), None)


def _celery_requests(*request_sets: Any) -> list[Any] | None:
    """Celery's request sets, read from another thread while the consumer changes them: a read
    that keeps colliding with a change ("set changed size during iteration") gives None."""
    for _ in range(5):
        try:
            return [request for requests in request_sets for request in requests]
        except RuntimeError:
            continue
    return None


def _delivery_tag(request: Any) -> str | None:
    tag = getattr(getattr(request, "message", None), "delivery_tag", None)
    return None if tag is None else str(tag)
