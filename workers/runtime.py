"""What a worker process shares across its task threads: settings, the HTTP client, the upstream
pool, the shard writers and the run state. Built once, closed on worker shutdown."""
from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass

from typing import Any

from common.run_state import RunState, connect
from common.settings import Settings, get_settings
from common.tokenizer import load_tokenizer
from workers.completion_split import CompletionSplitter
from workers.leases import LeaseKeeper, Reaper
from workers.sglang_client import SglangClient
from workers.shard_writer import ShardSet
from workers.upstreams import UpstreamPool

# Set when the worker begins to shut down: running streams give their task back to the queue.
SHUTDOWN = threading.Event()


@dataclass
class WorkerRuntime:
    settings: Settings
    name: str
    client: SglangClient
    upstreams: UpstreamPool
    shards: ShardSet
    redis_url: str
    tokenizer: Any | None
    splitter: CompletionSplitter

    def __post_init__(self) -> None:
        self._redis = connect(self.redis_url)
        self._states: dict[str, RunState] = {}
        self.leases = LeaseKeeper(self._redis, ttl_s=self.settings.lease_ttl_s,
                                  heartbeat_s=self.settings.lease_heartbeat_s)
        self.reaper = Reaper(self._redis, ttl_s=self.settings.lease_ttl_s,
                             interval_s=self.settings.reaper_interval_s)

    def start_background(self) -> None:
        """Lease heartbeat, reaper and upstream health probes: run in every worker, busy or not."""
        self.leases.start()
        self.reaper.start()
        self.upstreams.start_probes()

    def run_state(self, run: str) -> RunState:
        state = self._states.get(run)
        if state is None:
            state = self._states.setdefault(run, RunState(self._redis, run))
        return state

    def close(self) -> None:
        self.leases.stop()
        self.reaper.stop()
        self.upstreams.stop_probes()
        self.shards.close()
        self.client.close()


_runtime: WorkerRuntime | None = None
_lock = threading.Lock()
_pool_name = os.environ.get("GENFLEET_POOL", "worker")
_concurrency = 0  # requests in flight across all upstreams
# Threads beyond the in-flight cap: while one thread fsyncs its record, acks and fetches the next
# task, a spare one already holds the next stream, so the server's slots never sit empty.
SPARE_THREADS = 16


def configure(pool: str, concurrency: int) -> None:
    """Called by `genfleet worker` before Celery starts: the pool names the shards; `concurrency`
    is requests in flight (Celery gets SPARE_THREADS more threads)."""
    global _pool_name, _concurrency
    _pool_name, _concurrency = pool, concurrency


def pool_config() -> tuple[str, int]:
    """(pool name, task slots) as `genfleet worker` configured this process."""
    return _pool_name, _concurrency


def get_runtime() -> WorkerRuntime:
    global _runtime
    with _lock:
        if _runtime is None:
            settings = get_settings()
            upstreams = UpstreamPool(settings.upstreams, per_upstream_cap=_per_upstream_cap(settings),
                                     failure_threshold=settings.breaker_failures,
                                     open_s=settings.breaker_open_s, probe_interval_s=settings.health_interval_s)
            name = f"{_pool_name}-{socket.gethostname()}-{os.getpid()}"
            tokenizer = load_tokenizer(settings.tokenizer) if settings.tokenizer else None
            _runtime = WorkerRuntime(
                settings=settings,
                name=name,
                client=SglangClient(max_connections=max(_concurrency, 150) + SPARE_THREADS + 16,
                                    connect_timeout_s=settings.connect_timeout_s,
                                    stall_timeout_s=settings.stall_timeout_s),
                upstreams=upstreams,
                shards=ShardSet(settings.output_dir, name, max_bytes=settings.shard_max_bytes,
                                commit_interval_s=settings.commit_interval_s,
                                max_age_s=settings.shard_max_age_s),
                redis_url=settings.redis_url,
                tokenizer=tokenizer,
                splitter=CompletionSplitter(settings.reasoning_parser, tokenizer,
                                            skip_special_tokens=settings.skip_special_tokens),
            )
            # A host whose breaker closes again may have restarted with other settings.
            upstreams.on_recovered = _runtime.client.forget
        return _runtime


def _per_upstream_cap(settings: Settings) -> int:
    hosts = max(len(settings.upstreams), 1)
    return max(-(-_concurrency // hosts), 1) if _concurrency else 150


def close_runtime() -> None:
    global _runtime
    with _lock:
        if _runtime is not None:
            _runtime.close()
            _runtime = None
