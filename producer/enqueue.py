"""Enqueues a dataset once: read, normalise, template, count, partition, publish the prompts not yet
enqueued or done. Running it again on the same input publishes nothing new."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

from common.queues import PARTITIONS
from common.records import TaskPayload
from common.run_state import RunState
from producer.conversations import RowRejected, prompt_messages, to_messages
from producer.partitioning import choose_partition, prompt_id
from producer.publisher import TaskPublisher
from producer.readers import MalformedRow, SourceRow, read_dataset
from producer.templating import PromptTemplater

BATCH_ROWS = 512


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    path: Path
    pinned: str | None = None  # "short" | "long" | None (by length)

    @classmethod
    def parse(cls, text: str) -> DatasetSpec:
        """`NAME=PATH` or `NAME=PATH:long` / `NAME=PATH:short`."""
        name, sep, rest = text.partition("=")
        if not sep or not name or not rest:
            raise ValueError(f"dataset {text!r}: expected NAME=PATH or NAME=PATH:long")
        pinned = None
        path, colon, suffix = rest.rpartition(":")
        if colon and suffix in PARTITIONS:
            rest, pinned = path, suffix
        return cls(name, Path(rest), pinned)


@dataclass(frozen=True)
class EnqueueOptions:
    run: str
    max_new_tokens: dict[str, int]  # per partition
    long_threshold: int
    context_length: int | None
    sampling: dict[str, Any] = field(default_factory=dict)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    keep_token_ids: bool = False
    # "last": generate the reply to the conversation up to its last user turn;
    # "all": every assistant turn, in order (the worker templates each turn).
    regenerate: str = "last"


@dataclass
class Rejection:
    file: str
    line: int
    reason: str


@dataclass
class EnqueueReport:
    dataset: str
    enqueued: dict[str, int] = field(default_factory=lambda: {p: 0 for p in PARTITIONS})
    already_queued: int = 0
    rejected: list[Rejection] = field(default_factory=list)

    @property
    def total_enqueued(self) -> int:
        return sum(self.enqueued.values())


@dataclass(frozen=True)
class _Candidate:
    source: SourceRow
    id: str
    messages: list[dict[str, Any]]


def enqueue_dataset(spec: DatasetSpec, *, templater: PromptTemplater, state: RunState,
                    publisher: TaskPublisher, options: EnqueueOptions) -> EnqueueReport:
    report = EnqueueReport(spec.name)
    state.register_dataset(spec.name, str(spec.path))
    rows = read_dataset(spec.path)
    while batch := list(islice(rows, BATCH_ROWS)):
        candidates = []
        for item in batch:
            try:
                candidates.append(_candidate(spec.name, item, options.regenerate))
            except RowRejected as error:
                _reject(report, state, spec.name, item, str(error))
        fresh_rows = set(state.unclaimed_rows(spec.name, [c.source.row for c in candidates]))
        report.already_queued += len(candidates) - len(fresh_rows)
        fresh = [c for c in candidates if c.source.row in fresh_rows]
        if fresh:
            payloads = _payloads(spec, fresh, templater, options, report, state)
            publisher.publish(payloads)
            state.mark_enqueued(spec.name, (p.row for p in payloads))
            for payload in payloads:
                report.enqueued[payload.partition] += 1
    return report


def _candidate(dataset: str, item: SourceRow | MalformedRow, regenerate: str) -> _Candidate:
    if isinstance(item, MalformedRow):
        raise RowRejected(item.reason)
    messages = to_messages(item.data)
    prompt = prompt_messages(messages)  # rejects a conversation without a user turn
    return _Candidate(item, prompt_id(dataset, item.data, item.row), messages if regenerate == "all" else prompt)


def _payloads(spec: DatasetSpec, fresh: list[_Candidate], templater: PromptTemplater,
              options: EnqueueOptions, report: EnqueueReport, state: RunState) -> list[TaskPayload]:
    token_ids = templater.render([c.messages for c in fresh])
    now = time.time()
    payloads = []
    for candidate, ids in zip(fresh, token_ids, strict=True):
        partition = choose_partition(len(ids), pinned=spec.pinned,
                                     max_new_tokens_short=options.max_new_tokens["short"],
                                     long_threshold=options.long_threshold)
        max_new_tokens = options.max_new_tokens[partition]
        if options.context_length and len(ids) + max_new_tokens > options.context_length:
            reason = (f"prompt too long: {len(ids)} prompt tokens + {max_new_tokens} max new tokens "
                      f"> context length {options.context_length}")
            _reject(report, state, spec.name, candidate.source, reason)
            continue
        payloads.append(TaskPayload(
            run=options.run, id=candidate.id, dataset=spec.name, row=candidate.source.row,
            partition=partition, prompt_tokens=len(ids), max_new_tokens=max_new_tokens,
            messages=candidate.messages, sampling=dict(options.sampling),
            # With every turn regenerated, the worker templates each turn itself.
            input_ids=list(ids) if options.regenerate == "last" else None,
            chat_template_kwargs=dict(options.chat_template_kwargs), enqueued_at=now,
            keep_token_ids=options.keep_token_ids, regenerate=options.regenerate,
        ))
    return payloads


def _reject(report: EnqueueReport, state: RunState, dataset: str,
            item: SourceRow | MalformedRow, reason: str) -> None:
    report.rejected.append(Rejection(item.file, item.line, reason))
    state.record_rejection(dataset, item.row, item.file, item.line, reason)

