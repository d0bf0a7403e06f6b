"""A worker process: its Celery app and every Celery signal around its tasks.

The Celery app: every Celery setting genfleet uses, in one place (docs/ARCHITECTURE.md, "Celery
settings"). Built from the caller's `Settings`; the worker registers its task on it
(`workers.tasks.register`), Flower and `requeue` only publish and watch.

A worker process's life around its tasks, all its Celery signals in one place: start the lease
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
import signal
import sys
import threading
from typing import Any, NoReturn

from celery import Celery, states
from celery.signals import (
    task_postrun,
    task_prerun,
    task_received,
    worker_ready,
    worker_shutdown,
    worker_shutting_down,
)

from genfleet.common.queues import QUEUES, SERIALIZATION, SHORT
from genfleet.common.settings import Settings
from genfleet.common.tokenizer import BackgroundTokenizer
from genfleet.workers import tasks, telemetry
from genfleet.workers.runtime import WorkerRuntime


def create_app(settings: Settings) -> Celery:
    # kombu's Redis transport, changed where it would lose or re-run a prompt (workers/broker.py).
    app = Celery("genfleet", broker=settings.redis_url, amqp="genfleet.workers.broker:AMQP")
    transport = {
        # kombu re-queues an unacked task after this even if it still runs: far above any task.
        "visibility_timeout": settings.visibility_timeout_s,
        "unacked_restore_interval": settings.unacked_restore_interval_s,
        "unacked_restore_throttle": settings.unacked_restore_throttle,
        "socket_keepalive": True,
        "retry_on_timeout": True,
        # One list per queue, no priority lists: genfleet never sets a priority, and a worker then
        # takes its messages with one BLMOVE onto its transit list (workers/broker.py).
        "priority_steps": [0],
        # Each message's first lease is written as it is recorded in `unacked` (workers/broker.py).
        "lease_ttl_s": settings.lease_ttl_s,
    }
    app.conf.update(
        **SERIALIZATION,
        task_queues=QUEUES,
        task_default_queue=SHORT,
        task_default_exchange=SHORT,
        task_default_routing_key=SHORT,
        task_create_missing_queues=False,
        # A task is acknowledged only after it returns, i.e. after its record is fsynced.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_transport_options=transport,
        visibility_timeout=settings.visibility_timeout_s,
        # Results are the shards; the task's small return value only feeds Flower's task list.
        task_ignore_result=True,
        result_backend=None,
        worker_send_task_events=True,
        task_send_sent_event=True,
        broker_connection_retry_on_startup=True,
        # A lost broker connection must not stop running streams: their messages stay held under
        # their leases, and they are acknowledged once done (workers/broker.py).
        worker_cancel_long_running_tasks_on_connection_loss=False,
        # Publishing a retry must ride out a Redis restart, not fail the task.
        task_publish_retry_policy={"max_retries": 60, "interval_start": 0.5, "interval_step": 0.5,
                                   "interval_max": 3},
        worker_hijack_root_logger=False,
    )
    return app


log = logging.getLogger(__name__)

# The `task_postrun` states after which Celery acks the message (celery 5.7.0 celery/app/trace.py
# sends postrun with SUCCESS, FAILURE, RETRY or REJECTED; celery/worker/request.py acks all but a
# Reject). Failures are acked by `task_acks_on_failure_or_timeout`, on by default.
ACKED_STATES = frozenset({states.SUCCESS, states.FAILURE, states.RETRY})


def run_worker(settings: Settings, loglevel: str = "INFO") -> None:
    """`genfleet worker`: one Celery worker (threads pool) consuming `settings.pool`."""
    runtime = WorkerRuntime.build(settings)
    if runtime.tokenizer is None:
        log.warning("GENFLEET_TOKENIZER is not set: prompts enqueued with --first-max-new-tokens ask their full "
                    "cap at once on this worker (a staged cut is continued exactly only with the tokenizer)")
    app = create_app(settings)
    tasks.register(app, runtime)
    connect_signals(runtime)
    # `start`, not `worker_main`, which drops the exit status (celery 5.7.0 `app/base.py`).
    status = app.start(argv=[
        "worker", "--pool=threads", f"--concurrency={runtime.threads}", f"--queues={settings.pool}",
        f"--hostname={settings.pool}-{os.getpid()}@%h", "--task-events",
        "--without-gossip", "--without-mingle", f"--loglevel={loglevel}",
    ])
    if isinstance(runtime.tokenizer, BackgroundTokenizer) and runtime.tokenizer.failed:
        status = 1
    exit_at_once(status if isinstance(status, int) else 0)


def exit_at_once(status: int) -> NoReturn:
    """Ends the process once Celery has stopped: every record is fsynced and its shard sealed, every
    message acked or given back, the leases released (`worker_shutdown`, below). What the
    interpreter's own exit would add is freeing this process's heap object by object: 0.3 s of a
    core after a busy run, on the path of every `genfleet run`'s end. Logs are flushed first."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def wake_on_signals(hub: Any) -> None:
    """A signal (SIGTERM, Ctrl-C) wakes the worker's event loop at once.

    Celery's shutdown handler only sets `state.should_stop` (celery 5.7.0 `apps/worker.py`
    `_shutdown_handler`); the loop reads it between polls (`worker/loops.py` `asynloop`), and a
    poll that a signal interrupts is resumed for the rest of its timeout (PEP 475), up to a second
    of kombu's timers (kombu 5.7.0 `asynchronous/hub.py` `create_loop`). The hub's own waker wakes
    it only from another thread (`Hub.call_soon`). So the signal's byte goes to a pipe the hub
    watches (`signal.set_wakeup_fd`): written before the handler runs, it ends the resumed poll,
    and the loop finds `should_stop` set. Called on each `worker_ready` (Celery builds a new loop
    after a lost connection); one pipe per process."""
    global _signal_pipe
    if _signal_pipe is None:
        _signal_pipe = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(_signal_pipe[1], warn_on_full_buffer=False)
    read_end = _signal_pipe[0]

    def drain() -> None:
        try:
            while os.read(read_end, 512):
                pass
        except BlockingIOError:
            pass

    hub.add_reader(read_end, drain)


_signal_pipe: tuple[int, int] | None = None


def connect_signals(runtime: WorkerRuntime) -> None:
    beacon: list[telemetry.Beacon] = []

    def started(sender: Any = None, **_: Any) -> None:
        if hub := getattr(sender, "hub", None):
            wake_on_signals(hub)
        runtime.start_background()
        beacon.append(telemetry.start(runtime))  # beacon for `status`, Prometheus /metrics

    def lease_received(request: Any = None, **_: Any) -> None:
        # Leased on receipt, not on start: a retry held back for its countdown must not look abandoned.
        tag = getattr(getattr(request, "message", None), "delivery_tag", None)
        if tag:
            runtime.leases.hold(str(tag), task_id=getattr(request, "id", None), request=request)

    def task_started(task: Any = None, args: Any = None, **_: Any) -> None:
        if key := telemetry.task_key(task, args):
            telemetry.IN_FLIGHT.change(key, +1)

    def task_finished(task: Any = None, args: Any = None, state: str | None = None,
                      **_: Any) -> None:
        if key := telemetry.task_key(task, args):
            telemetry.IN_FLIGHT.change(key, -1)
        # The delivery this thread ran (`runtime.leased_request`), never "the running one of this task
        # id": a retry, or a second delivery of the same message, shares the id. Every state but
        # REJECTED is acked (task_acks_late; genfleet's Reject always requeues).
        runtime.leases.release(runtime.leases.current(), acked=state in ACKED_STATES)

    def stop_streams_after_grace(**_: Any) -> None:
        grace = runtime.settings.shutdown_grace_s
        log.warning("shutting down: running streams have %.0f s to finish, then are re-queued", grace)
        timer = threading.Timer(grace, stop_streams)
        timer.daemon = True
        timer.start()

    def stop_streams() -> None:
        runtime.shutdown.set()
        runtime.server.interrupt_streams()  # a silent stream (a long prefill) is cut at once

    def close(**_: Any) -> None:
        for each in beacon:
            each.stop()
        runtime.close()

    for celery_signal, handler in ((worker_ready, started), (task_received, lease_received),
                                   (task_prerun, task_started), (task_postrun, task_finished),
                                   (worker_shutting_down, stop_streams_after_grace), (worker_shutdown, close)):
        celery_signal.connect(handler, weak=False)
