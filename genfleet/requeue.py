"""`genfleet failures` and `genfleet requeue`: dead letters (prompts that failed for good, with why)
grouped for the operator, and requeued onto their queue once the cause is fixed. A letter leaves the
store only after it is re-published. Operator tooling: it never runs in a worker (the worker's
retry-or-dead-letter policy is `workers/failures.py`); the letter type is `common/run_state.py`.
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Optional

import typer
from celery import Celery

from genfleet.common.queues import GENERATE_TASK
from genfleet.common.run_state import DeadLetter, RunState, connect
from genfleet.common.settings import Settings
from genfleet.onebox.embedded_redis import reach_redis


@dataclass(frozen=True)
class FailureGroup:
    error_class: str
    message: str  # with numbers replaced by N, so "input (812 tokens)" and "(907 tokens)" group
    count: int
    example_id: str


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


@contextmanager
def _settings(redis_url: str | None) -> Iterator[Settings]:
    """GENFLEET_* env vars, with the Redis the command reaches on top: `--redis-url`, else
    GENFLEET_REDIS_URL, else a one-box job's embedded Redis (`onebox/embedded_redis.py`)."""
    with reach_redis(redis_url) as url:
        yield Settings(redis_url=url)


def failures_command(
    run: Annotated[str, typer.Option(help="Run id")],
    redis_url: Annotated[Optional[str], typer.Option(help="Default: GENFLEET_REDIS_URL")] = None,
) -> None:
    """Dead letters of a run, grouped by error class and message."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    with _settings(redis_url) as settings:
        letters = RunState(connect(settings.redis_url), run).read_dead_letters()
    table = Table(title=f"dead letters · run {run} · {len(letters)} prompts")
    for column in ("count", "class", "message", "example id"):
        table.add_column(column, justify="right" if column == "count" else "left")
    for group in group_failures(letters):
        table.add_row(str(group.count), group.error_class, escape(group.message), escape(group.example_id))
    Console().print(table)


def requeue_command(
    run: Annotated[str, typer.Option(help="Run id")],
    dataset: Annotated[Optional[str], typer.Option(help="Only this dataset")] = None,
    error_class: Annotated[Optional[str], typer.Option(help="Only this class: permanent, exhausted, integrity")] = None,
    match: Annotated[Optional[str], typer.Option(help="Only letters whose message contains this text")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(
        help="Override max_new_tokens (e.g. to fit the context)")] = None,
    dry_run: Annotated[bool, typer.Option(help="Show what would be requeued; change nothing")] = False,
    redis_url: Annotated[Optional[str], typer.Option(help="Default: GENFLEET_REDIS_URL")] = None,
) -> None:
    """Put dead letters back on their queue; each leaves the store only once re-published."""
    from rich.console import Console

    with _settings(redis_url) as settings:
        state = RunState(connect(settings.redis_url), run)
        chosen = select(state.read_dead_letters(), dataset=dataset, error_class=error_class, match=match)
        console = Console()
        if dry_run:
            for letter in chosen:
                console.print(f"would requeue {letter.id} ({letter.error_class}: {letter.message[:100]})",
                              markup=False)
            console.print(f"{len(chosen)} dead letters would be requeued")
            return
        from genfleet.progress import terminal_progress
        from genfleet.workers.lifecycle import create_app

        app = create_app(settings)
        # Each letter is published and dropped from the store one by one: thousands take a while. The
        # bar (rate, ETA) is on stderr and only on a terminal; stdout keeps the lines scripts read.
        with terminal_progress(Console(stderr=True), transient=True) as progress:
            letters = progress.track(chosen, description="requeueing dead letters")
            count = requeue(state, app, letters, max_new_tokens=max_new_tokens)
        console.print(f"requeued {count} dead letters of run {run}")
