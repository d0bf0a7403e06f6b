"""A worker process's life around its tasks, all its Celery signals in one place: start the lease
heartbeat, reaper, health probes and telemetry when Celery is ready, lease every message it
receives, count tasks in flight, and shut down gracefully.

The threads pool has no working soft shutdown: on SIGTERM, running streams get `shutdown_grace_s`
to finish, then give their message back (`Reject(requeue=True)`); records already being written
are always finished first.

Handlers are closures over this process's runtime, connected with `weak=False`: Celery's signals
hold weak references by default (`celery/utils/dispatch/signal.py`), which would drop them at once.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Any

from celery import states
from celery.signals import (
    task_postrun,
    task_prerun,
    task_received,
    worker_ready,
    worker_shutdown,
    worker_shutting_down,
)

from genfleet.common.settings import Settings
from genfleet.workers import tasks, telemetry
from genfleet.workers.app import create_app
from genfleet.workers.runtime import WorkerRuntime, running_delivery_tag

log = logging.getLogger(__name__)

# The `task_postrun` states after which Celery acks the message (celery 5.7.0 celery/app/trace.py
# sends postrun with SUCCESS, FAILURE, RETRY or REJECTED; celery/worker/request.py acks all but a
# Reject). Failures are acked by `task_acks_on_failure_or_timeout`, on by default.
ACKED_STATES = frozenset({states.SUCCESS, states.FAILURE, states.RETRY})


def run_worker(settings: Settings, loglevel: str = "INFO") -> None:
    """`genfleet worker`: one Celery worker (threads pool) consuming `settings.pool`."""
    runtime = WorkerRuntime.build(settings)
    app = create_app(settings)
    tasks.register(app, runtime)
    connect_signals(runtime)
    app.worker_main(argv=[
        "worker", "--pool=threads", f"--concurrency={runtime.threads}", f"--queues={settings.pool}",
        f"--hostname={settings.pool}-{os.getpid()}@%h", "--task-events",
        "--without-gossip", "--without-mingle", f"--loglevel={loglevel}",
    ])


def connect_signals(runtime: WorkerRuntime) -> None:
    beacon: list[telemetry.Beacon] = []

    def started(**_: Any) -> None:
        runtime.start_background()
        beacon.append(telemetry.start(runtime))  # beacon for `status`, Prometheus /metrics

    def lease_received(request: Any = None, **_: Any) -> None:
        # Leased on receipt, not on start: a retry held back for its countdown must not look abandoned.
        tag = getattr(getattr(request, "message", None), "delivery_tag", None)
        if tag:
            runtime.leases.hold(str(tag))

    def task_started(task: Any = None, args: Any = None, **_: Any) -> None:
        if key := telemetry.task_key(task, args):
            telemetry.IN_FLIGHT.change(key, +1)

    def task_finished(task_id: str | None = None, task: Any = None, args: Any = None, state: str | None = None,
                      **_: Any) -> None:
        if key := telemetry.task_key(task, args):
            telemetry.IN_FLIGHT.change(key, -1)
        if task_id and (tag := running_delivery_tag(task_id)):
            # Every state but REJECTED is acked (task_acks_late; genfleet's Reject always requeues).
            runtime.leases.release(tag, acked=state in ACKED_STATES)

    def stop_streams_after_grace(**_: Any) -> None:
        grace = runtime.settings.shutdown_grace_s
        log.warning("shutting down: running streams have %.0f s to finish, then are re-queued", grace)
        timer = threading.Timer(grace, stop_streams)
        timer.daemon = True
        timer.start()

    def stop_streams() -> None:
        runtime.shutdown.set()
        runtime.client.interrupt_streams()  # a silent stream (a long prefill) is cut at once

    def close(**_: Any) -> None:
        for each in beacon:
            each.stop()
        runtime.close()

    for signal, handler in ((worker_ready, started), (task_received, lease_received), (task_prerun, task_started),
                            (task_postrun, task_finished), (worker_shutting_down, stop_streams_after_grace),
                            (worker_shutdown, close)):
        signal.connect(handler, weak=False)
