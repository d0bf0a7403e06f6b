"""The generate task: route → stream → split reasoning → write (fsync) → account.

The task returns only once its record is durable, and Celery acknowledges it only then
(acks_late), so an acknowledged prompt is always on disk. What happens to a failed attempt is
`workers/failures.py`'s decision.
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict
from typing import Any

import redis
from celery import Celery, Task
from celery.exceptions import Reject

from common.names import task_problem
from common.queues import GENERATE_TASK
from common.reasoning import get_format, starts_in_reasoning
from common.records import CompletionRecord, TaskPayload, Timing, Turn, Usage
from common.run_state import Outcome
from common.tokenizer import render_prompts
from workers import telemetry
from workers.disk import DiskUnwritable
from workers.errors import GenerationError, PermanentError, ShutdownRequested, TransientError
from workers.failures import handle_failure
from workers.runtime import WorkerRuntime
from workers.sglang.client import Generation
from workers.sglang.requests import chat_body, generate_body
from workers.shard_writer import ShardWriteFailed
from workers.turns import history_before, reply_positions

log = logging.getLogger(__name__)


def register(app: Celery, runtime: WorkerRuntime) -> Task:
    """The generate task on `app`, running on `runtime`."""

    # Attempts are counted in the payload (max_retries=None): failures.py decides when to stop.
    @app.task(name=GENERATE_TASK, bind=True, max_retries=None)
    def generate(self: Task, raw_payload: dict[str, Any]) -> dict[str, Any]:
        payload = TaskPayload.from_dict(raw_payload)
        try:
            return complete(payload, runtime)
        except ShutdownRequested:
            raise Reject("worker shutting down", requeue=True) from None
        except (DiskUnwritable, redis.RedisError) as error:
            # A local fault (the disk, a Redis outage past the client's retries) is not the
            # prompt's: no attempt counted, no dead letter. A record already written is found by
            # the done check's next run, or deduplicated by export.
            log.warning("giving %s back to the queue: %s", payload.id, error)
            raise Reject(str(error), requeue=True) from None
        except GenerationError as error:
            handle_failure(self, payload, runtime, error)
        except Exception as error:  # noqa: BLE001 - a bug or an outage must not lose the prompt
            log.exception("unexpected error on %s", payload.id)
            handle_failure(self, payload, runtime, TransientError(f"{type(error).__name__}: {error}"))

    return generate


def complete(payload: TaskPayload, runtime: WorkerRuntime) -> dict[str, Any]:
    # Before any GPU time or file: a run or dataset name that could leave the output root (a forged
    # task, one sent through Flower) is dead-lettered, never generated (common/names.py).
    if (unsafe := task_problem(payload.run, payload.dataset, payload.id)) is not None:
        raise PermanentError(f"unsafe task: {unsafe}")
    state = runtime.run_state(payload.run)
    if state.is_done(payload.dataset, payload.row):
        return {"id": payload.id, "skipped": "already done"}
    started_at = time.time()
    deadline = time.monotonic() + runtime.settings.task_deadline_s
    try:
        turns, prompt = generate_turns(payload, runtime, deadline)
    except BudgetSpent:
        state.mark_skipped(payload.dataset, payload.row)
        return {"id": payload.id, "skipped": f"dataset token budget of {payload.max_tokens_per_dataset} spent"}
    record = build_record(payload, runtime, turns, prompt, started_at)
    try:
        runtime.shards.write(payload.run, payload.dataset, record.to_json_line())
    except ShardWriteFailed as error:
        runtime.disk.failed(str(error))
        raise DiskUnwritable(str(error)) from error
    outcome = outcome_of(record, runtime.settings.reasoning_parser, payload.chat_template_kwargs)
    if state.mark_done(payload.dataset, payload.row, outcome):
        # A record written twice (a crash before the ack) is counted once, like the counters.
        telemetry.completed(runtime, payload, record)  # rates and lengths for `status`, Prometheus
    return summary(record)


def generate_turns(payload: TaskPayload, runtime: WorkerRuntime,
                   deadline: float) -> tuple[list[tuple[Turn, Generation]], list[dict]]:
    """Each reply the payload asks for, in order; returns them and the last reply's prompt."""
    replies: dict[int, dict] = {}
    turns = []
    prompt = payload.messages
    for position in reply_positions(payload.messages, payload.regenerate):
        prompt = history_before(payload.messages, position, replies)
        generation, upstream = stream_reply(payload, runtime, prompt, deadline)
        split = runtime.splitter.split(generation, payload.chat_template_kwargs)
        turn = Turn(
            reasoning=split.reasoning, content=split.content,
            finish_reason=generation.finish_reason.get("type", "stop"),
            matched_stop=generation.finish_reason.get("matched"),
            usage=Usage(prompt_tokens=generation.prompt_tokens, completion_tokens=generation.completion_tokens,
                        reasoning_tokens=generation.reasoning_tokens, cached_tokens=generation.cached_tokens),
            upstream=upstream,
            output_ids=generation.output_ids if payload.keep_token_ids else None,
        )
        turns.append((turn, generation))
        replies[position] = {"role": "assistant", "content": split.content}
    return turns, prompt


def stream_reply(payload: TaskPayload, runtime: WorkerRuntime, prompt: list[dict],
                 deadline: float) -> tuple[Generation, str]:
    settings, pool = runtime.settings, runtime.upstreams
    input_ids = None if settings.api == "chat" else prompt_ids(payload, runtime, prompt)
    stop = runtime.shutdown.is_set
    # Before any GPU time is spent: a record that cannot be written is work thrown away.
    runtime.disk.wait_writable(settings.disk_wait_s, stop)
    with pool.lease(avoid=payload.failed_upstream, wait_s=max(deadline - time.monotonic(), 1.0),
                    should_stop=stop) as upstream:
        # Checked once a slot is held, right before generating: a spare thread may have waited.
        # Prompts already streaming may still overshoot the budget by their own length.
        if budget_spent(payload, runtime):
            raise BudgetSpent()
        try:
            if settings.api == "chat":
                generation = runtime.client.chat(upstream, chat_body(payload, prompt), deadline=deadline,
                                                 should_stop=stop)
            else:
                body = generate_body(payload, input_ids, skip_special_tokens=settings.skip_special_tokens,
                                     stream_interval=settings.stream_interval)
                generation = runtime.client.generate(upstream, body, deadline=deadline, should_stop=stop)
        except GenerationError as error:
            error.upstream = upstream
            pool.report(upstream, ok=not error.blames_upstream)
            raise
        pool.report(upstream, ok=True)
        return generation, upstream


class BudgetSpent(Exception):
    """The dataset's completion-token budget is used up: the prompt is skipped, not generated."""


def budget_spent(payload: TaskPayload, runtime: WorkerRuntime) -> bool:
    budget = payload.max_tokens_per_dataset
    return budget is not None and runtime.run_state(payload.run).completion_tokens(payload.dataset) >= budget


def prompt_ids(payload: TaskPayload, runtime: WorkerRuntime, prompt: list[dict]) -> list[int] | None:
    """The producer's ids for the first reply; later turns are templated here, with the model's own
    replies in the history."""
    if payload.regenerate == "last":
        return payload.input_ids
    if runtime.tokenizer is None:
        raise PermanentError("--regenerate all over /generate needs the model's tokenizer on the worker: "
                             "set GENFLEET_TOKENIZER=/path/to/model (or GENFLEET_API=chat)")
    return render_prompts(runtime.tokenizer, [prompt], payload.chat_template_kwargs)[0]


def build_record(payload: TaskPayload, runtime: WorkerRuntime, turns: list[tuple[Turn, Generation]],
                 prompt: list[dict], started_at: float) -> CompletionRecord:
    last, generation = turns[-1]
    first_token_s = turns[0][1].first_token_s
    usage = Usage(
        prompt_tokens=sum(t.usage.prompt_tokens for t, _ in turns) or payload.prompt_tokens,
        completion_tokens=sum(t.usage.completion_tokens for t, _ in turns),
        reasoning_tokens=sum(t.usage.reasoning_tokens for t, _ in turns),
        cached_tokens=sum(t.usage.cached_tokens for t, _ in turns),
    )
    return CompletionRecord(
        id=payload.id, run=payload.run, dataset=payload.dataset, partition=payload.partition,
        messages=prompt, reasoning=last.reasoning, content=last.content,
        finish_reason=last.finish_reason, matched_stop=last.matched_stop, usage=usage,
        upstream=last.upstream, model=runtime.client.model_name(last.upstream), sampling=payload.sampling,
        timing=Timing(enqueued_at=payload.enqueued_at, started_at=started_at, first_token_s=first_token_s,
                      duration_s=time.time() - started_at, e2e_latency=generation.e2e_latency),
        attempts=payload.attempt, worker=runtime.name, output_ids=last.output_ids,
        turns=[asdict(turn) for turn, _ in turns] if payload.regenerate == "all" else None,
        row=payload.row,
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
    # Throughput first: Flower's task list cuts the result's repr short (the id is in its args).
    return {
        "tok_s": round(record.usage.completion_tokens / seconds, 1) if seconds > 0 else None,
        "completion_tokens": record.usage.completion_tokens,
        "reasoning_tokens": record.usage.reasoning_tokens, "finish_reason": record.finish_reason,
        "seconds": round(seconds, 3), "upstream": record.upstream, "id": record.id,
    }
