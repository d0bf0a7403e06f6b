"""The Celery app: every Celery setting genfleet uses, in one place (docs/ARCHITECTURE.md, "Celery
settings"). Built from the caller's `Settings`; the worker registers its task on it
(`workers.tasks.register`), Flower and `requeue` only publish and watch."""
from __future__ import annotations

from celery import Celery

from genfleet.common.queues import QUEUES, SERIALIZATION, SHORT
from genfleet.common.settings import Settings


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
