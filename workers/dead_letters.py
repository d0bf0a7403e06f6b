"""Dead letters: prompts that failed for good, with why. Grouped for the operator, and requeued
onto their queue once the cause is fixed (a letter leaves the store only after it is re-published)."""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Iterable

from celery import Celery

from common.queues import GENERATE_TASK
from common.records import TaskPayload
from common.run_state import RunState


@dataclass(frozen=True)
class DeadLetter:
    id: str
    payload: TaskPayload
    error_class: str
    message: str
    attempts: int
    upstream: str | None
    time: float


@dataclass(frozen=True)
class FailureGroup:
    error_class: str
    message: str  # with numbers replaced by N, so "input (812 tokens)" and "(907 tokens)" group
    count: int
    example_id: str


def read_dead_letters(state: RunState) -> list[DeadLetter]:
    letters = []
    for prompt_id, raw in state.dead_letters().items():
        letters.append(DeadLetter(
            id=prompt_id, payload=TaskPayload.from_dict(raw["payload"]), error_class=raw["error_class"],
            message=raw["message"], attempts=raw["attempts"], upstream=raw.get("upstream"), time=raw["time"],
        ))
    return sorted(letters, key=lambda letter: letter.time)


def group_failures(letters: Iterable[DeadLetter]) -> list[FailureGroup]:
    counts: Counter[tuple[str, str]] = Counter()
    examples: dict[tuple[str, str], str] = {}
    for letter in letters:
        key = (letter.error_class, re.sub(r"\d+", "N", letter.message)[:300])
        counts[key] += 1
        examples.setdefault(key, letter.id)
    return [FailureGroup(cls, message, count, examples[(cls, message)])
            for (cls, message), count in counts.most_common()]


def select(letters: Iterable[DeadLetter], *, dataset: str | None = None, error_class: str | None = None,
           match: str | None = None) -> list[DeadLetter]:
    return [letter for letter in letters
            if (dataset is None or letter.payload.dataset == dataset)
            and (error_class is None or letter.error_class == error_class)
            and (match is None or match in letter.message)]


def requeue(state: RunState, app: Celery, letters: Iterable[DeadLetter], *,
            max_new_tokens: int | None = None) -> int:
    """Re-publish each letter's payload as a fresh first attempt, then drop it from the store."""
    count = 0
    with app.producer_or_acquire() as producer:
        for letter in letters:
            payload = letter.payload
            payload.attempt, payload.failed_upstream = 1, None
            if max_new_tokens is not None:
                payload.max_new_tokens = max_new_tokens
            app.send_task(GENERATE_TASK, args=[payload.to_dict()], queue=payload.partition, producer=producer,
                          argsrepr=payload.argsrepr("requeued"), kwargsrepr="{}")
            state.forget_dead_letter(payload.dataset, letter.id)
            count += 1
    return count
