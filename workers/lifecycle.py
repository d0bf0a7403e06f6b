"""A worker process's life around its tasks: start the lease heartbeat, reaper and health probes
when Celery is ready, lease every message it receives, and shut down gracefully.

The threads pool has no working soft shutdown: on SIGTERM, running streams get `shutdown_grace_s`
to finish, then give their message back (`Reject(requeue=True)`); records already being written
are always finished first.
"""
from __future__ import annotations

import logging
import threading
from typing import Any

from celery.signals import task_postrun, task_received, worker_ready, worker_shutdown, worker_shutting_down

from workers import telemetry
from workers.runtime import SHUTDOWN, close_runtime, get_runtime, pool_config

log = logging.getLogger(__name__)


@worker_ready.connect
def _start_background(**_: Any) -> None:
    get_runtime().start_background()
    telemetry.start(get_runtime(), *pool_config())  # beacon for `status`, Prometheus /metrics


@task_received.connect
def _lease_received(request: Any = None, **_: Any) -> None:
    # Leased on receipt, not on start: a retry held back for its countdown must not look abandoned.
    tag = getattr(getattr(request, "message", None), "delivery_tag", None)
    if tag:
        get_runtime().leases.hold(request.id, str(tag))


@task_postrun.connect
def _release_finished(task_id: str | None = None, **_: Any) -> None:
    if task_id:
        get_runtime().leases.release(task_id)


@worker_shutting_down.connect
def _stop_streams_after_grace(**_: Any) -> None:
    grace = get_runtime().settings.shutdown_grace_s
    log.warning("shutting down: running streams have %.0f s to finish, then are re-queued", grace)
    timer = threading.Timer(grace, SHUTDOWN.set)
    timer.daemon = True
    timer.start()


@worker_shutdown.connect
def _close(**_: Any) -> None:
    telemetry.stop()
    close_runtime()

