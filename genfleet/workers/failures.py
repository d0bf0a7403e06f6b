"""Retry or dead-letter: decided here, once, for every failed attempt (as dramatiq decides it in its
retries middleware).

A retryable error is published again with the next attempt number, after exponential backoff
with full jitter, marked with the upstream that failed so the next try prefers another. A
permanent error, or a retryable one past `max_attempts`, becomes a dead letter of its class
(`permanent`, `exhausted`, `integrity`) and the task fails in Flower with that verdict. If the retry
cannot even be published (the broker is down), the message goes back to the queue untouched.
"""
from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import redis
from celery import Task
from celery.exceptions import Reject, Retry

from genfleet.common.records import TaskPayload
from genfleet.common.run_state import TRANSIENT
from genfleet.workers import telemetry
from genfleet.workers.errors import (
    DiskUnwritable,
    GenerationError,
    IntegrityError,
    NoFreeSlot,
    NoUpstreamAvailable,
    ShutdownRequested,
    TransientError,
    UpstreamAborted,
)
from genfleet.workers.runtime import WorkerRuntime

log = logging.getLogger(__name__)


def handle_error(task: Task, payload: TaskPayload, runtime: WorkerRuntime, error: Exception, *,
                 superseded: bool) -> NoReturn:
    """Every way a task body fails, decided here: raises Reject (the message given back), Retry, or
    the error itself (the task's FAILURE, a dead letter).

    - A copy whose message was delivered again (`superseded`: its lease lapsed while its worker
      stood still) gives it back, which touches nothing: the message is the new delivery's.
    - The worker's shutdown, and local faults (the disk, a Redis outage past the client's retries,
      this worker's own caps on healthy hosts) are not the prompt's: no attempt counted, no dead
      letter. A wait for a slot while every host was down is an attempt, tried again later. A record
      already written is found by the done check's next run, or deduplicated by export.
    - A generation's failure gets its verdict (`handle_failure`); anything else is a bug or an
      outage, which must not lose the prompt: a transient failure."""
    if superseded:
        give_back(f"its message was delivered again: this copy stopped ({type(error).__name__})")
    if isinstance(error, ShutdownRequested):
        give_back("worker shutting down")
    if isinstance(error, NoFreeSlot):
        if error.healthy:
            # Every healthy host stayed at this worker's cap (long streams, or `--in-flight auto`
            # lowered the caps): nothing the prompt did; another worker may have room.
            log.warning("giving %s back to the queue: %s", payload.id, error)
            give_back(str(error))
        error = NoUpstreamAvailable(f"every upstream down: {error}")  # an attempt, tried again later
    if isinstance(error, (DiskUnwritable, redis.RedisError)):
        log.warning("giving %s back to the queue: %s", payload.id, error)
        give_back(str(error))
    if not isinstance(error, GenerationError):
        log.error("unexpected error on %s", payload.id, exc_info=error)
        error = TransientError(f"{type(error).__name__}: {error}")
    handle_failure(task, payload, runtime, error)


def give_back(reason: str) -> NoReturn:
    """The message goes back to its queue as it came: no attempt counted, no dead letter. Every
    give-back of a task's message goes through here (`Reject(requeue=True)`, which Celery turns into
    kombu's requeue; genfleet's requeues only the delivery it names: `workers/broker.py` `settle`)."""
    raise Reject(reason, requeue=True) from None


def handle_failure(task: Task, payload: TaskPayload, runtime: WorkerRuntime, error: GenerationError) -> NoReturn:
    """Raises Retry, Reject or the error itself (the task's FAILURE)."""
    settings = runtime.settings
    error_class = verdict(error, payload.attempt, settings.max_attempts)
    telemetry.failed(runtime, payload, error, error_class)  # error rate for `status`, Prometheus
    with redis_fault_gives_back(payload):
        count_failure(runtime, payload, error)
    if error_class == TRANSIENT:
        retry(task, payload, error, retry_countdown(payload.attempt, settings.retry_backoff_s,
                                                    settings.retry_backoff_max_s))
    with redis_fault_gives_back(payload):
        runtime.run_state(payload.run).record_dead_letter(payload, error_class, str(error), error.upstream)
    # Raising marks the task FAILURE in Flower with the error's type, class and message.
    raise error.as_dead_letter(error_class, payload.attempt)


def verdict(error: GenerationError, attempt: int, max_attempts: int) -> str:
    """`transient` (tried again), or the dead-letter class: the error's own (`permanent`,
    `integrity`, ...) for one retrying cannot help, its `exhausted_class` once the attempts are used up."""
    if not error.retryable:
        return error.error_class
    return TRANSIENT if attempt < max_attempts else error.exhausted_class


@contextmanager
def redis_fault_gives_back(payload: TaskPayload) -> Iterator[None]:
    """A Redis that refuses a write (an outage past the client's retries, a full `noeviction`
    Redis) is a local fault: the message goes back to the queue rather than being acked with its
    failure unrecorded (Celery acks a failed task by default: `task_acks_on_failure_or_timeout`)."""
    try:
        yield
    except redis.RedisError as error:
        log.warning("could not record %s's state in Redis (%s); giving its message back", payload.id, error)
        give_back(f"redis: {error}")


def count_failure(runtime: WorkerRuntime, payload: TaskPayload, error: GenerationError) -> None:
    """The per-dataset counters `status` shows for failures that say something about the data."""
    if isinstance(error, UpstreamAborted):
        runtime.run_state(payload.run).count(payload.dataset, "aborted")
    if isinstance(error, IntegrityError):
        log.warning("integrity check failed for %s on %s (attempt %d): %s", payload.id, error.upstream,
                    payload.attempt, error)
        runtime.run_state(payload.run).count(payload.dataset, "integrity")


def retry(task: Task, payload: TaskPayload, error: GenerationError, countdown: float) -> NoReturn:
    # Attempts are counted in the payload; Celery's own retry limit would otherwise raise the error
    # on its 4th retry and fail the task without a dead letter (the task sets max_retries=None).
    again = TaskPayload.from_dict({**payload.to_dict(), "attempt": payload.attempt + 1,
                                   "failed_upstream": error.upstream})
    try:
        # Our own argsrepr, or Flower would show the whole payload, prompt included.
        raise task.retry(args=[again.to_dict()], countdown=countdown, exc=error,
                         argsrepr=again.argsrepr(f"attempt {again.attempt}"))
    except Retry:
        raise
    except Exception:  # noqa: BLE001 - the retry could not be published (broker down)
        log.exception("could not publish the retry of %s; giving the message back", payload.id)
        give_back("retry not published")


def retry_countdown(attempt: int, base_s: float, max_s: float) -> float:
    """Exponential backoff with full jitter: spreads a burst of failures over time."""
    return random.uniform(0, min(max_s, base_s * 2 ** (attempt - 1)))
