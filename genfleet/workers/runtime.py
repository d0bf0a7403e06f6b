"""What a worker process shares across its task threads: settings, the HTTP client, the upstream
pool, the shard writers and the run state. Built once from the worker's `Settings`, closed on
worker shutdown; the task and the signal handlers receive it, nothing looks it up globally."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

import redis
from celery.worker import state as celery_state
from celery.worker.request import Request

from genfleet.common.fleet_stats import streams_to
from genfleet.common.queues import IN_FLIGHT_PER_HOST
from genfleet.common.run_state import RunState, connect
from genfleet.common.settings import Settings
from genfleet.common.tokenizer import BackgroundTokenizer
from genfleet.workers.admission import AdmissionControl
from genfleet.workers.delivery import Blackout, LeaseKeeper, Reaper
from genfleet.workers.errors import ShutdownRequested
from genfleet.workers.generation.completion_text import CompletionSplitter
from genfleet.workers.generation.first_cap import FirstCaps
from genfleet.workers.output import DiskGuard, ShardSet
from genfleet.workers.servers.api import ServerApi
from genfleet.workers.servers.kinds import AnyServer
from genfleet.workers.upstreams import UpstreamPool

# Threads beyond the in-flight cap: while one thread fsyncs its record, acks and fetches the next
# task, a spare one already holds the next stream, so the server's slots never sit empty.
SPARE_THREADS = 16
# Connections beyond the threads: health probes and the server's pages share the client.
SPARE_CONNECTIONS = 16
# A health probe waits this long: a busy server may answer slowly, and a probe is not on any task's path.
PROBE_TIMEOUT_S = 20.0


@dataclass
class WorkerRuntime:
    settings: Settings
    name: str
    server: ServerApi
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
        server = AnyServer(max_connections=in_flight + SPARE_THREADS + SPARE_CONNECTIONS,
                              connect_timeout_s=settings.connect_timeout_s, stall_timeout_s=settings.stall_timeout_s)
        upstreams = UpstreamPool(settings.upstreams, per_upstream_cap=per_upstream_cap(settings),
                                 healthy=lambda url: server.health(url, timeout_s=PROBE_TIMEOUT_S).ready,
                                 failure_threshold=settings.breaker_failures, open_s=settings.breaker_open_s,
                                 probe_interval_s=settings.health_interval_s, routing=settings.routing)
        # A host whose breaker closes again may have restarted with other settings.
        upstreams.on_recovered = server.forget
        name = f"{settings.pool}-{socket.gethostname()}-{os.getpid()}"
        tokenizer = (BackgroundTokenizer(settings.tokenizer, on_failure=stop_this_worker, unavailable=ShutdownRequested,
                                         trust_remote_code=settings.trust_remote_code)
                     if settings.tokenizer else None)
        client_redis = connect(settings.redis_url)
        blackout = Blackout()  # the heartbeat and the reaper of this process share what they saw of Redis
        return cls(
            settings=settings, name=name, server=server, upstreams=upstreams,
            shards=ShardSet(settings.output_dir, name, max_bytes=settings.shard_max_bytes,
                            commit_interval_s=settings.commit_interval_s, max_age_s=settings.shard_max_age_s),
            tokenizer=tokenizer,
            splitter=CompletionSplitter(settings.reasoning_parser, tokenizer,
                                        skip_special_tokens=settings.skip_special_tokens),
            redis=client_redis,
            leases=LeaseKeeper(client_redis, ttl_s=settings.lease_ttl_s, heartbeat_s=settings.lease_heartbeat_s,
                               will_run=celery_will_run, blackout=blackout),
            reaper=Reaper(client_redis, ttl_s=settings.lease_ttl_s, interval_s=settings.reaper_interval_s,
                          restart_grace_s=settings.lease_ttl_s,
                          unaccounted_interval_s=settings.unaccounted_check_interval_s, blackout=blackout),
            disk=DiskGuard(settings.output_dir, min_free_bytes=settings.min_free_disk_mb * 2**20),
            first_caps=FirstCaps(client_redis, settings),
            admission=AdmissionControl(upstreams, server, ceiling=per_upstream_cap(settings),
                                       start=IN_FLIGHT_PER_HOST[settings.pool],
                                       interval_s=settings.admission_interval_s,
                                       steer=settings.in_flight_mode == "auto",
                                       others=lambda: streams_to(client_redis, besides=name)),
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

    def should_stop(self) -> bool:
        """Whether the calling task thread's stream should stop: the worker is shutting down, or the
        message it runs was delivered again (its lease lapsed while this process stood still)."""
        if self.shutdown.is_set():
            return True
        delivery = self.leases.current()
        return delivery is not None and delivery.superseded.is_set()

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
        self.server.close()


def stop_this_worker(_error: BaseException) -> None:
    """A worker whose tokenizer did not load stops (a warm shutdown: what runs gives its message
    back) and exits 1 (`lifecycle.run_worker` reads `BackgroundTokenizer.failed`), its log saying why."""
    os.kill(os.getpid(), signal.SIGTERM)


def per_upstream_cap(settings: Settings) -> int:
    """The in-flight cap split evenly over the hosts (rounded up)."""
    hosts = max(len(settings.upstreams), 1)
    return max(-(-settings.in_flight() // hosts), 1)


def celery_will_run(request: Any) -> bool:
    """Whether Celery will still run `request`: handed to the thread pool (`execute_using_pool` sets
    `_apply_result`: celery 5.7.0 `worker/request.py`; the executor then runs it whatever
    `Consumer.on_close` does to the request sets on a lost connection, `worker/consumer/consumer.py`),
    or waiting in the timer for its countdown (`scheduled_requests`; `on_close` cancels those). A
    request held in a rate-limit bucket is in neither: no genfleet task has a `rate_limit`."""
    if request is None:
        return True
    return getattr(request, "_apply_result", None) is not None or request in celery_state.scheduled_requests


def leased_request(leases: LeaseKeeper) -> type[Request]:
    """The generate task's Celery `Request` class (`Task.Request`, Celery's hook for a custom
    request): it tells the lease keeper which delivery each pool thread runs, so that the task stops
    a copy whose message was delivered again and the lease released at its end is its own."""

    class LeasedRequest(Request):
        def on_accepted(self, pid: int, time_accepted: float) -> None:
            # In the pool thread, just before the task (celery 5.7.0 `concurrency/base.py` `apply_target`).
            leases.bind(self)
            super().on_accepted(pid, time_accepted)

    return LeasedRequest
