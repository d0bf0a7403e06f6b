"""The generate task: route → stream → split reasoning → write (fsync) → account.

The task returns only once its record is durable, and Celery acknowledges it only then
(acks_late), so an acknowledged prompt is always on disk.
"""
from __future__ import annotations

import logging
import random
import time
from typing import Any, NoReturn

from celery import Task
from celery.exceptions import Reject
from celery.signals import worker_shutdown, worker_shutting_down

from common.queues import GENERATE_TASK
from common.reasoning import get_format, split_reasoning, starts_in_reasoning
from common.records import CompletionRecord, TaskPayload, Timing, Usage
from common.run_state import Outcome
from workers.app import app
from workers.errors import EXHAUSTED, GenerationError, ShutdownRequested, TransientError, UpstreamAborted
from workers.runtime import SHUTDOWN, WorkerRuntime, close_runtime, get_runtime
from workers.sglang_client import Generation

log = logging.getLogger(__name__)


@worker_shutting_down.connect
def _stop_streams(**_: Any) -> None:
    SHUTDOWN.set()


@worker_shutdown.connect
def _close_shards(**_: Any) -> None:
    close_runtime()


@app.task(name=GENERATE_TASK, bind=True)
def generate(self: Task, raw_payload: dict[str, Any]) -> dict[str, Any]:
    payload = TaskPayload.from_dict(raw_payload)
    runtime = get_runtime()
    try:
        return complete(payload, runtime)
    except ShutdownRequested:
        raise Reject("worker shutting down", requeue=True) from None
    except GenerationError as error:
        return _handle_failure(self, payload, runtime, error)
    except Exception as error:  # noqa: BLE001 - a bug or an outage must not lose the prompt
        log.exception("unexpected error on %s", payload.id)
        return _handle_failure(self, payload, runtime, TransientError(f"{type(error).__name__}: {error}"))


def complete(payload: TaskPayload, runtime: WorkerRuntime) -> dict[str, Any]:
    state = runtime.run_state(payload.run)
    if state.is_done(payload.dataset, payload.row):
        return {"id": payload.id, "skipped": "already done"}
    started_at = time.time()
    deadline = time.monotonic() + runtime.settings.task_deadline_s
    with runtime.upstreams.lease() as upstream:
        try:
            generation = runtime.client.generate(upstream, generate_request(payload, runtime),
                                                 deadline=deadline, should_stop=SHUTDOWN.is_set)
        except GenerationError as error:
            error.upstream = upstream
            raise
    record = build_record(payload, runtime, generation, upstream, started_at)
    runtime.shards.write(payload.run, payload.dataset, record.to_json_line())
    outcome = outcome_of(record, runtime.settings.reasoning_parser, payload.chat_template_kwargs)
    state.mark_done(payload.dataset, payload.row, outcome)
    return summary(record)


def generate_request(payload: TaskPayload, runtime: WorkerRuntime) -> dict[str, Any]:
    sampling = {
        **payload.sampling,
        "max_new_tokens": payload.max_new_tokens,
        # Keep </think> in the text: with it skipped, reasoning silently merges into content.
        "skip_special_tokens": False,
        "stream_interval": runtime.settings.stream_interval,
    }
    prompt = {"input_ids": payload.input_ids} if payload.input_ids is not None else {"text": payload.text}
    return {**prompt, "stream": True, "sampling_params": sampling}


def build_record(payload: TaskPayload, runtime: WorkerRuntime, generation: Generation,
                 upstream: str, started_at: float) -> CompletionRecord:
    split = split_reasoning(generation.text, runtime.settings.reasoning_parser, payload.chat_template_kwargs)
    return CompletionRecord(
        id=payload.id, run=payload.run, dataset=payload.dataset, partition=payload.partition,
        messages=payload.messages, reasoning=split.reasoning, content=split.content,
        finish_reason=generation.finish_reason.get("type", "stop"),
        matched_stop=generation.finish_reason.get("matched"),
        usage=Usage(prompt_tokens=generation.prompt_tokens or payload.prompt_tokens,
                    completion_tokens=generation.completion_tokens,
                    reasoning_tokens=generation.reasoning_tokens,
                    cached_tokens=generation.cached_tokens),
        upstream=upstream, model=runtime.client.model_name(upstream), sampling=payload.sampling,
        timing=Timing(enqueued_at=payload.enqueued_at, started_at=started_at,
                      first_token_s=generation.first_token_s, duration_s=generation.duration_s,
                      e2e_latency=generation.e2e_latency),
        attempts=payload.attempt, worker=runtime.name,
        output_ids=generation.output_ids if payload.keep_token_ids else None,
    )


def outcome_of(record: CompletionRecord, parser: str, chat_template_kwargs: dict[str, Any]) -> Outcome:
    expects_reasoning = starts_in_reasoning(get_format(parser), chat_template_kwargs)
    return Outcome(
        prompt_tokens=record.usage.prompt_tokens, completion_tokens=record.usage.completion_tokens,
        reasoning_tokens=record.usage.reasoning_tokens, truncated=record.finish_reason == "length",
        empty_reasoning=expects_reasoning and not record.reasoning.strip(),
        empty_content=not record.content.strip(),
    )


def summary(record: CompletionRecord) -> dict[str, Any]:
    """What Flower's task list shows for a finished prompt."""
    seconds = record.timing.duration_s
    return {
        "id": record.id, "finish_reason": record.finish_reason,
        "completion_tokens": record.usage.completion_tokens,
        "reasoning_tokens": record.usage.reasoning_tokens, "upstream": record.upstream,
        "seconds": round(seconds, 3),
        "tok_s": round(record.usage.completion_tokens / seconds, 1) if seconds > 0 else None,
    }


def _handle_failure(task: Task, payload: TaskPayload, runtime: WorkerRuntime,
                    error: GenerationError) -> NoReturn:
    settings = runtime.settings
    if isinstance(error, UpstreamAborted):
        runtime.run_state(payload.run).count(payload.dataset, "aborted")
    if error.retryable and payload.attempt < settings.max_attempts:
        countdown = retry_countdown(payload.attempt, settings.retry_backoff_s, settings.retry_backoff_max_s)
        payload.attempt += 1
        raise task.retry(args=[payload.to_dict()], countdown=countdown, max_retries=None, exc=error)
    error_class = EXHAUSTED if error.retryable else error.error_class
    runtime.run_state(payload.run).record_dead_letter(payload, error_class, str(error), error.upstream)
    # Raising marks the task FAILURE in Flower with the error's type and message.
    raise error


def retry_countdown(attempt: int, base_s: float, max_s: float) -> float:
    """Exponential backoff with full jitter: spreads a burst of failures over time."""
    return random.uniform(0, min(max_s, base_s * 2 ** (attempt - 1)))
