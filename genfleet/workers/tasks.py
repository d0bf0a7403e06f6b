"""The generate task: route → stream → split reasoning → write (fsync) → account.

The task returns only once its record is durable, and Celery acknowledges it only then
(acks_late), so an acknowledged prompt is always on disk. What happens to a failed attempt is
`workers/failures.py`'s decision.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from celery import Celery, Task

from genfleet.common.names import task_problem
from genfleet.common.queues import GENERATE_TASK
from genfleet.common.reasoning import get_format, starts_in_reasoning
from genfleet.common.records import CompletionRecord, TaskPayload
from genfleet.common.run_state import Outcome
from genfleet.workers import telemetry
from genfleet.workers.broker import NextInLine
from genfleet.workers.errors import (
    BudgetSpent,
    DiskUnwritable,
    PermanentError,
    ShardWriteFailed,
)
from genfleet.workers.failures import give_back, handle_error
from genfleet.workers.generation.first_cap import staged
from genfleet.workers.generation.replies import generate_replies
from genfleet.workers.runtime import WorkerRuntime, leased_request

log = logging.getLogger(__name__)


class Publish(Protocol):
    """Publishes a follow-up task: behind what waits on its queue, or `next_in_line`."""

    def __call__(self, task: TaskPayload, note: str, *, next_in_line: bool = False) -> None: ...


# How long a worker holds a task of a newer genfleet before giving it back.
NEWER_TASK_PAUSE_S = 5.0


def register(app: Celery, runtime: WorkerRuntime) -> Task:
    """The generate task on `app`, running on `runtime`."""

    front = NextInLine(app, runtime.redis)

    # Attempts are counted in the payload (max_retries=None): failures.py decides when to stop.
    @app.task(name=GENERATE_TASK, bind=True, max_retries=None, Request=leased_request(runtime.leases))
    def generate(self: Task, raw_payload: dict[str, Any]) -> dict[str, Any]:
        delivery = runtime.leases.current()
        # A message delivered to this worker again while an older copy of it still runs here (its
        # lease lapsed in a pause) starts once that copy has stopped: never two streams of one prompt.
        if delivery is not None and not runtime.leases.await_turn(delivery, runtime.settings.task_deadline_s):
            give_back("an older copy of this message still runs in this worker")
        if delivery is not None and delivery.superseded.is_set():  # delivered again while it waited here
            give_back("its message was delivered again before this copy started")
        if unknown := TaskPayload.unknown_fields(raw_payload):
            # A newer genfleet's task, in a rolling upgrade (a staged part's follow-up carries
            # `staged_from`). Read without the field it could give another record (a staged part
            # written as the whole completion), and failed it would be acked (Celery acks failures),
            # left to `status`'s unaccounted count and a requeue by hand: it goes back to the queue
            # for an upgraded worker, after a pause so that an old worker does not spin on it.
            log.error("task %s has fields this worker does not know (%s): sent by a newer genfleet; upgrade "
                      "this worker; giving it back to the queue", raw_payload.get("id"), ", ".join(unknown))
            time.sleep(NEWER_TASK_PAUSE_S)
            give_back(f"fields of a newer genfleet: {', '.join(unknown)}")
        payload = TaskPayload.from_dict(raw_payload)

        def publish(task: TaskPayload, note: str, *, next_in_line: bool = False) -> None:
            # Our own argsrepr, or Flower would show the whole payload (and a continuation's ids).
            if next_in_line:
                front.publish(task.to_dict(), task.partition, task.argsrepr(note))
            else:
                self.apply_async(args=[task.to_dict()], queue=task.partition, argsrepr=task.argsrepr(note))

        try:
            return complete(payload, runtime, publish)
        except Exception as error:  # noqa: BLE001 - every failure is decided in workers/failures.py
            handle_error(self, payload, runtime, error,
                         superseded=delivery is not None and delivery.superseded.is_set())

    return generate


def complete(payload: TaskPayload, runtime: WorkerRuntime,
             publish: Publish) -> dict[str, Any]:
    # Before any GPU time or file: a run or dataset name that could leave the output root (a forged
    # task, one sent through Flower) is dead-lettered, never generated (common/names.py).
    if (unsafe := task_problem(payload.run, payload.dataset, payload.id)) is not None:
        raise PermanentError(f"unsafe task: {unsafe}")
    state = runtime.run_state(payload.run)
    if state.is_done(payload.dataset, payload.row):
        return {"id": payload.id, "skipped": "already done"}
    started_at = time.time()
    deadline = time.monotonic() + runtime.settings.task_deadline_s
    payload = staged(payload, runtime.first_caps.cap_for(payload), api=runtime.settings.api,
                     exact_text=runtime.tokenizer is not None)
    try:
        replies = generate_replies(payload, runtime, deadline, started_at)
    except BudgetSpent:
        state.mark_skipped(payload.dataset, payload.row)
        return {"id": payload.id, "skipped": f"dataset token budget of {payload.max_tokens_per_dataset} spent"}
    if replies.next_part is not None:
        return hand_over(payload, replies.next_part, replies.completion_tokens, publish)
    record = replies.record
    assert record is not None  # a completion not handed over has its record
    try:
        runtime.shards.write(payload.run, payload.dataset, record.to_json_line())
    except ShardWriteFailed as error:
        runtime.disk.failed(str(error))
        raise DiskUnwritable(str(error)) from error
    outcome = outcome_of(record, runtime.settings.reasoning_parser, payload.chat_template_kwargs)
    # One round trip: the done bit, the counters and the rates for `status`, counted once per row
    # (a record written twice, by a crash before the ack, is counted once).
    if state.mark_done(payload.dataset, payload.row, outcome, telemetry.completion_updates(payload, record)):
        telemetry.completed(runtime, payload, record)  # Prometheus
    return summary(record)


def hand_over(payload: TaskPayload, next_part: TaskPayload, completion_tokens: int,
              publish: Publish) -> dict[str, Any]:
    """Publish the follow-up of a cut completion (continue or regenerate) instead of writing it;
    this message is acked once the follow-up is in Redis. A crash in between publishes it twice:
    both finish the same prompt, which the done bit counts once and export keeps once."""
    kind = "continue" if next_part.continuation is not None else "regenerate"
    note = (f"part {next_part.continuation['parts'] + 1}, {completion_tokens} tokens so far"
            if next_part.continuation is not None else f"regenerated with {next_part.max_new_tokens} new tokens")
    try:
        # The next stage of a staged cap goes next in line (workers/generation/first_cap.py); a
        # truncation's follow-up waits on `long` like any long prompt.
        publish(next_part, note, next_in_line=payload.staged_from is not None)
    except Exception as error:  # noqa: BLE001 - the broker is down: nothing is lost if the message goes back
        log.warning("could not publish the %s of %s (%s); giving its message back", kind, payload.id, error)
        give_back(f"follow-up not published: {error}")
    return {"id": payload.id, "finish_reason": "length", "then": kind,
            "completion_tokens": completion_tokens}


def outcome_of(record: CompletionRecord, parser: str, chat_template_kwargs: dict[str, Any]) -> Outcome:
    return Outcome.of_record(record, expects_reasoning=starts_in_reasoning(get_format(parser), chat_template_kwargs))


def summary(record: CompletionRecord) -> dict[str, Any]:
    """What Flower's task list shows for a finished prompt."""
    seconds = record.timing.duration_s
    # Throughput first: Flower's task list cuts the result's repr short (the id is in its args).
    return {
        "tok_s": round(record.usage.completion_tokens / seconds, 1) if seconds > 0 else None,
        "completion_tokens": record.usage.completion_tokens,
        "reasoning_tokens": record.usage.reasoning_tokens, "finish_reason": record.finish_reason,
        "seconds": round(seconds, 3), "upstream": record.upstream, "id": record.id,
    }
