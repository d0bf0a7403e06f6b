"""Enqueues one dataset, a batch of rows at a time: read → normalise → id and dedupe → skip what is
already queued or done → template and count → partition and check the context → encode → publish
atomically. Running it again on the same input publishes nothing new; after a kill, exactly the rest.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from itertools import islice
from typing import Any, Protocol

from genfleet.common.records import TaskPayload
from genfleet.common.run_state import OutgoingTask, RowRejection
from genfleet.producer.enqueue_report import DatasetReport, rejection_kind
from genfleet.producer.prompts import (
    DuplicateIds,
    PromptTemplater,
    RowRejected,
    choose_partition,
    prompt_messages,
    read_row,
    row_key,
    sample_payload,
    sample_slots,
    spread_samples,
)
from genfleet.producer.publisher import PublishResult
from genfleet.producer.readers import MalformedRow, SourceRow, open_dataset
from genfleet.producer.run_config import DatasetConfig, RunConfig

# SGLang refuses a request whose input + max_new_tokens + reserved tokens exceed the context
# (0.5.23 `tokenizer_manager.py::_validate_one_request`); with EAGLE speculative decoding it reserves
# `speculative_eagle_topk * speculative_num_steps` or the draft token count (`managers/utils.py::
# compute_num_reserved_tokens`), tens of tokens. A continued completion stops this far short.
CONTINUATION_MARGIN = 64


class Destination(Protocol):
    """Where encoded tasks go: Redis (`TaskPublisher`) or nowhere (`DryRunDestination`)."""

    def claims(self, dataset: str, rows: list[int]) -> tuple[set[int], set[int]]:
        """(rows already enqueued, rows already done) among `rows`."""

    def encode(self, row: int, partition: str, payload: dict[str, Any], argsrepr: str) -> OutgoingTask: ...

    def publish(self, dataset: str, tasks: list[OutgoingTask], rejections: list[RowRejection]) -> PublishResult: ...


@dataclass(frozen=True, slots=True)
class _Candidate:
    source: SourceRow
    id: str
    messages: list[dict[str, Any]]
    max_tokens: int | None  # the row's own cap (OpenAI Batch `max_tokens`)


# The first batch of a dataset is this small, so the workers get their first prompts after ~15 ms
# of templating rather than a whole batch's ~120 ms (1,024 rows): the time to the first record.
FIRST_BATCH_ROWS = 128


def enqueue_dataset(dataset: DatasetConfig, config: RunConfig, run: str, *, templater: PromptTemplater,
                    destination: Destination, context_length: int | None,
                    on_rows: Callable[[int], None] | None = None) -> DatasetReport:
    """`context_length`: the model's, already resolved (flag, run file or tokenizer)."""
    report = DatasetReport(dataset.name, run)
    rows = open_dataset(dataset.source).rows()
    batch_pass = _BatchPass(dataset, config, run, templater, destination, context_length, report)
    # Batch k is published on a thread (waiting on Redis, not holding the GIL) while batch k+1 is
    # templated: one batch in flight, in order, each still one atomic publish.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="genfleet-publish") as publishing:
        in_flight: Future[PublishResult] | None = None
        size = min(FIRST_BATCH_ROWS, config.batch_rows)
        while batch := list(islice(rows, size)):
            size = config.batch_rows
            report.rows_read += len(batch)
            tasks, rejections, cut = batch_pass.prepare(batch)
            if in_flight is not None:
                _account(report, in_flight.result())
            in_flight = publishing.submit(destination.publish, dataset.name, tasks, rejections)
            if on_rows is not None:
                on_rows(len(batch))
            if cut:
                break
        if in_flight is not None:
            _account(report, in_flight.result())
    return report


def _account(report: DatasetReport, result: PublishResult) -> None:
    for partition, count in result.published.items():
        report.enqueued[partition] += count
    report.already_queued += result.claimed


class _BatchPass:
    """The per-batch steps; holds what lives across batches (dedupe, the max_prompts count)."""

    def __init__(self, dataset: DatasetConfig, config: RunConfig, run: str, templater: PromptTemplater,
                 destination: Destination, context_length: int | None, report: DatasetReport) -> None:
        self.dataset, self.config, self.run = dataset, config, run
        self.templater, self.destination, self.report = templater, destination, report
        self.context_length = context_length
        self.duplicates = DuplicateIds()
        self.accepted = 0  # prompts toward max_prompts: enqueued now, or by an earlier run

    def prepare(self, batch: list[SourceRow | MalformedRow]) -> tuple[list[OutgoingTask], list[RowRejection], bool]:
        """The batch's encoded tasks and rejections, and whether max_prompts is reached (stop reading)."""
        rejections: list[RowRejection] = []
        candidates = [c for c in (self._candidate(item, rejections) for item in batch) if c is not None]
        samples = self.dataset.samples
        slots_of = [sample_slots(c.source.row, samples) for c in candidates]
        # Earlier batches may still be publishing: their rows are others, so this answer holds.
        enqueued, done = self.destination.claims(self.dataset.name, [slot for slots in slots_of for slot in slots])
        claimed = enqueued | done
        fresh = [c for c, slots in zip(candidates, slots_of, strict=True) if not claimed.issuperset(slots)]
        token_ids = iter(self.templater.render([c.messages for c in fresh], self.dataset.chat_template_kwargs))
        tasks: list[list[OutgoingTask]] = []  # per prompt, its samples
        now = time.time()
        cut_row = None
        for candidate, slots in zip(candidates, slots_of, strict=True):
            self.report.already_queued += len(enqueued.intersection(slots))
            self.report.already_done += len(done.intersection(slots))
            if claimed.issuperset(slots):
                self.accepted += 1
            else:
                new = self._tasks(candidate, next(token_ids), now, rejections, [s for s in slots if s not in claimed])
                if not new:
                    continue
                tasks.append(new)
                self.accepted += 1
            if self.dataset.max_prompts is not None and self.accepted >= self.dataset.max_prompts:
                cut_row = candidate.source.row
                break
        if cut_row is not None:  # rows after the cut were never considered: no verdict on them
            rejections = [r for r in rejections if r.row < cut_row]
        for rejection in rejections:
            self.report.reject(rejection, rejection_kind(rejection.reason))
        # A rejected prompt is recorded once, at its first sample's slot.
        return spread_samples(tasks), [replace(r, row=r.row * samples) for r in rejections], cut_row is not None

    def _candidate(self, item: SourceRow | MalformedRow, rejections: list[RowRejection]) -> _Candidate | None:
        if isinstance(item, MalformedRow):
            rejections.append(RowRejection(item.row, item.file, item.line, item.reason))
            return None
        try:
            key = row_key(item.data, item.row)
            prompt = read_row(item.data, self.dataset.row_format, self.dataset.prompt_field)
            last_turn = prompt_messages(prompt.messages)  # also: a conversation needs a user turn
        except RowRejected as error:
            rejections.append(RowRejection(item.row, item.file, item.line, str(error)))
            return None
        if self.duplicates.is_duplicate(key):
            reason = f"duplicate id {key.text!r}: an earlier row has it (only that one is enqueued)"
            rejections.append(RowRejection(item.row, item.file, item.line, reason))
            return None
        messages = prompt.messages if self.config.regenerate == "all" else last_turn
        return _Candidate(item, f"{self.dataset.name}/{key.text}", messages, prompt.max_tokens)

    def _tasks(self, candidate: _Candidate, ids: list[int], now: float, rejections: list[RowRejection],
               slots: list[int]) -> list[OutgoingTask]:
        """One task per sample slot not yet claimed (one slot without `--samples`); none when rejected."""
        dataset, prompt_tokens = self.dataset, len(ids)
        row_cap = candidate.max_tokens
        short_cap = dataset.max_new_tokens["short"]
        short_need = short_cap if row_cap is None else min(row_cap, short_cap)
        partition = choose_partition(prompt_tokens, pinned=dataset.pinned, max_new_tokens_short=short_need,
                                     long_threshold=self.config.long_threshold)
        max_new_tokens = dataset.max_new_tokens[partition]
        if row_cap is not None:
            max_new_tokens = min(max_new_tokens, row_cap)
        too_long = self._too_long(prompt_tokens, max_new_tokens)
        if too_long:
            source = candidate.source
            rejections.append(RowRejection(source.row, source.file, source.line, too_long))
            return []
        # A row's own cap (OpenAI Batch max_tokens) is the whole budget: never continued past it.
        total = dataset.max_new_tokens_total if row_cap is None else max_new_tokens
        if self.context_length is not None:
            # Every part's prompt + max_new_tokens adds up to prompt + total: keep it inside the
            # context with room for the tokens a speculative server reserves (see CONTINUATION_MARGIN).
            total = min(total, self.context_length - prompt_tokens - CONTINUATION_MARGIN)
            if self.config.context_rule == "clip":
                max_new_tokens = min(max_new_tokens, self.context_length - prompt_tokens)
        base = TaskPayload(
            run=self.run, id=candidate.id, dataset=dataset.name, row=candidate.source.row, partition=partition,
            prompt_tokens=prompt_tokens, max_new_tokens=max_new_tokens, messages=candidate.messages,
            # With every turn regenerated, the worker templates each turn itself.
            input_ids=ids if self.config.regenerate == "last" else None,
            sampling=dataset.sampling, chat_template_kwargs=dataset.chat_template_kwargs, enqueued_at=now,
            keep_token_ids=self.config.keep_token_ids, regenerate=self.config.regenerate,
            max_tokens_per_dataset=dataset.max_tokens_per_dataset, loop_guard=dataset.loop_guard,
            on_truncated=dataset.on_truncated, max_new_tokens_total=max(total, max_new_tokens),
            first_max_new_tokens=dataset.first_max_new_tokens,
        )
        tasks = []
        for slot in slots:
            payload = base if dataset.samples == 1 else sample_payload(base, slot, dataset.samples)
            # A dataclass's __dict__ is asdict() without the deep copy of every message.
            tasks.append(self.destination.encode(slot, partition, payload.__dict__, payload.argsrepr()))
            self.report.message_bytes[partition] += len(tasks[-1].message)
        self.report.prompt_tokens[partition].extend([prompt_tokens] * len(slots))
        return tasks

    def _too_long(self, prompt_tokens: int, max_new_tokens: int) -> str | None:
        context = self.context_length
        if context is None:
            return None
        if self.config.context_rule == "clip":
            if prompt_tokens >= context:
                return f"prompt too long: {prompt_tokens} prompt tokens >= context length {context}"
            return None
        if prompt_tokens + max_new_tokens > context:
            return (f"prompt too long: {prompt_tokens} prompt tokens + {max_new_tokens} max new tokens "
                    f"> context length {context}")
        return None
