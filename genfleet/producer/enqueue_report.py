"""What `genfleet enqueue` prints: the per-dataset report, the dry run, the run's summary and the live
progress.

What enqueueing (or a dry run of) one dataset found: counts per outcome and partition, rejections
with file, line and reason, prompt-token statistics and the bytes the queued messages take.

`genfleet enqueue --dry-run`: the whole enqueue pass (read, template, partition, reject, encode)
with a destination that keeps nothing. It never connects to Redis, so it cannot change any state;
it reports every row as new, whatever a run has already enqueued.

The tables `genfleet enqueue` ends with: what was enqueued, already there, skipped or rejected;
and for `--dry-run`, prompts, token statistics and queue memory per dataset and partition.

The live view while enqueueing: a rich progress bar per dataset (rows read, rate), and a note when
the producer waits for a queue to drain (`--max-queue-depth`). Without a terminal, plain lines.
"""
from __future__ import annotations

import time
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from celery import Celery
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from typing_extensions import Self

from genfleet.common.kombu_wire import TaskMessageEncoder
from genfleet.common.queues import PARTITIONS, QUEUES, SERIALIZATION
from genfleet.common.run_state import OutgoingTask, RowRejection
from genfleet.producer.publisher import PublishResult

# Every rejection is counted; only this many are kept to show (a broken file may have millions).
KEPT_REJECTIONS = 1000


@dataclass(frozen=True)
class TokenStats:
    count: int
    min: int
    median: float
    mean: float
    p99: int
    max: int

    @classmethod
    def of(cls, values: array) -> TokenStats | None:
        if not values:
            return None
        ordered = sorted(values)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        return cls(len(ordered), ordered[0], median(ordered), sum(ordered) / len(ordered), p99, ordered[-1])


@dataclass
class DatasetReport:
    dataset: str
    run: str
    enqueued: dict[str, int] = field(default_factory=lambda: {p: 0 for p in PARTITIONS})
    already_queued: int = 0  # enqueued by an earlier run, not done yet
    already_done: int = 0  # done by an earlier run: skipped
    duplicates: int = 0  # a later row with an id seen before; also counted in `rejected`
    rejected: int = 0
    rejected_by_kind: Counter = field(default_factory=Counter)
    rejections: list[RowRejection] = field(default_factory=list)
    rows_read: int = 0
    # Per partition, of the prompts accepted in this pass (what was or would be enqueued).
    prompt_tokens: dict[str, array] = field(default_factory=lambda: {p: array("I") for p in PARTITIONS})
    message_bytes: dict[str, int] = field(default_factory=lambda: {p: 0 for p in PARTITIONS})

    @property
    def total_enqueued(self) -> int:
        return sum(self.enqueued.values())

    def reject(self, rejection: RowRejection, kind: str) -> None:
        self.rejected += 1
        self.rejected_by_kind[kind] += 1
        if kind == "duplicate id":
            self.duplicates += 1
        if len(self.rejections) < KEPT_REJECTIONS:
            self.rejections.append(rejection)

    def token_stats(self, partition: str) -> TokenStats | None:
        return TokenStats.of(self.prompt_tokens[partition])


def rejection_kind(reason: str) -> str:
    """The reason without its particulars, to count rejections by cause."""
    for prefix in ("invalid JSON", "invalid UTF-8", "prompt too long", "duplicate id", "no user turn"):
        if reason.startswith(prefix):
            return prefix
    return "malformed row"


# What Redis spends beyond the message bytes: list-node headers and allocator size classes. Measured
# on redis 7 with 0.3-30 KB messages: 3-15 % more, depending on how sizes meet jemalloc's classes.
MEMORY_OVERHEAD_RATIO = 1.08
ENTRY_OVERHEAD_BYTES = 16

class DryRunDestination:
    def __init__(self) -> None:
        # Encoding builds the same bytes a real run would push; the app never opens a connection.
        app = Celery("genfleet-dry-run", broker="memory://", set_as_current=False)
        app.conf.update(**SERIALIZATION, task_queues=QUEUES)
        self.encoder = TaskMessageEncoder(app)

    def claims(self, dataset: str, rows: list[int]) -> tuple[set[int], set[int]]:
        return set(), set()

    def encode(self, row: int, partition: str, payload: dict[str, Any], argsrepr: str) -> OutgoingTask:
        _task_id, message = self.encoder.encode(payload, partition, argsrepr)
        return OutgoingTask(row, partition, message)

    def publish(self, dataset: str, tasks: list[OutgoingTask], rejections: list[RowRejection]) -> PublishResult:
        result = PublishResult()
        for task in tasks:
            result.published[task.partition] += 1
        return result


def queue_memory_bytes(message_bytes: int, messages: int) -> int:
    """Estimated Redis memory for `messages` queued messages of `message_bytes` bytes in all (±10 %)."""
    return int(message_bytes * MEMORY_OVERHEAD_RATIO) + messages * ENTRY_OVERHEAD_BYTES


SHOWN_REJECTIONS = 20


def print_rejections(console: Console, report: DatasetReport) -> None:
    for rejection in report.rejections[:SHOWN_REJECTIONS]:
        console.print(f"[yellow]rejected[/] {escape(rejection.file)}:{rejection.line}: {escape(rejection.reason)}",
                      soft_wrap=True)
    if report.rejected > SHOWN_REJECTIONS:
        by_kind = ", ".join(f"{count} {kind}" for kind, count in report.rejected_by_kind.most_common())
        console.print(f"[yellow]… {report.rejected - SHOWN_REJECTIONS} more rejections in "
                      f"{escape(report.dataset)}[/] ({by_kind})")


def results_table(run: str, reports: list[DatasetReport], elapsed_s: float) -> Table:
    table = Table(title=f"enqueue · run {escape(run)}")
    for column in ("dataset", "short", "long", "already queued", "skipped (done)", "duplicates", "rejected"):
        table.add_column(column, justify="left" if column == "dataset" else "right")
    for r in reports:
        table.add_row(escape(r.dataset), f"{r.enqueued['short']:,}", f"{r.enqueued['long']:,}",
                      f"{r.already_queued:,}", f"{r.already_done:,}", f"{r.duplicates:,}", f"{r.rejected:,}")
    enqueued = sum(r.total_enqueued for r in reports)
    rows = sum(r.rows_read for r in reports)
    table.caption = (f"{enqueued:,} prompts enqueued, {rows:,} rows read in {elapsed_s:.1f} s "
                     f"({rows / max(elapsed_s, 1e-9):,.0f} rows/s)")
    return table


def dry_run_table(reports: list[DatasetReport]) -> Table:
    table = Table(title="dry run: nothing was published")
    for column in ("dataset", "partition", "prompts", "min", "median", "mean", "p99", "max",
                   "queue memory"):
        table.add_column(column, justify="left" if column in ("dataset", "partition") else "right")
    for r in reports:
        for partition in PARTITIONS:
            stats = r.token_stats(partition)
            if stats is None:
                continue
            memory = queue_memory_bytes(r.message_bytes[partition], stats.count)
            table.add_row(escape(r.dataset), partition, f"{stats.count:,}", f"{stats.min:,}",
                          f"{stats.median:,.0f}", f"{stats.mean:,.1f}", f"{stats.p99:,}", f"{stats.max:,}",
                          _size(memory))
        if not any(r.prompt_tokens[p] for p in PARTITIONS):
            table.add_row(escape(r.dataset), "-", "0", "", "", "", "", "", "")
    table.caption = "prompt tokens per prompt; queue memory if every prompt waited in Redis at once"
    return table


def queue_depth_table(reports: list[DatasetReport], max_queue_depth: dict[str, int]) -> Table:
    """Per queue: its depth limit and the Redis memory that limit implies at these prompts' mean
    message size (what a full queue takes, and the most this run can hold there at once)."""
    table = Table(title="queues at --max-queue-depth")
    for column in ("queue", "depth limit", "mean message", "full queue", "this run at most"):
        table.add_column(column, justify="left" if column == "queue" else "right")
    for partition in PARTITIONS:
        prompts = sum(len(r.prompt_tokens[partition]) for r in reports)
        if not prompts:
            continue
        mean = sum(r.message_bytes[partition] for r in reports) / prompts
        limit = max_queue_depth.get(partition, 0)
        held = min(limit, prompts) if limit else prompts
        full = _size(queue_memory_bytes(int(mean * limit), limit)) if limit else "no limit"
        table.add_row(partition, f"{limit:,}" if limit else "none", _size(int(mean)), full,
                      _size(queue_memory_bytes(int(mean * held), held)))
    table.caption = ("Redis memory of the waiting messages (±10 %); a message in flight sits in kombu's "
                     "unacked table instead")
    return table


def rejections_table(reports: list[DatasetReport]) -> Table | None:
    if not any(r.rejected for r in reports):
        return None
    table = Table(title="rejected (never enqueued)")
    for column in ("dataset", "reason", "rows", "first"):
        table.add_column(column, justify="right" if column == "rows" else "left")
    for r in reports:
        for kind, count in r.rejected_by_kind.most_common():
            first = next((x for x in r.rejections if rejection_kind(x.reason) == kind), None)
            example = f"{first.file}:{first.line}: {first.reason}" if first else ""
            table.add_row(escape(r.dataset), kind, f"{count:,}", escape(example))
    return table


def _size(size: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024  # type: ignore[assignment]
    return f"{size} B"  # pragma: no cover


# Without a terminal, say "waiting" at most this often.
WAIT_NOTE_EVERY_S = 10.0


class EnqueueProgress:
    def __init__(self, console: Console) -> None:
        self.console = console
        self.live = console.is_terminal
        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
            console=console, disable=not self.live, transient=False,
        )
        self._task: TaskID | None = None
        self._name = ""
        self._started = 0.0
        self._waiting = False
        self._last_note = 0.0

    def __enter__(self) -> Self:
        self.progress.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.finish_dataset()
        self.progress.stop()

    def dataset(self, name: str, total_rows: int | None) -> Callable[[int], None]:
        """Starts a dataset's bar; returns the callback that advances it by rows read."""
        self.finish_dataset()
        self._name, self._started, self._waiting = name, time.monotonic(), False
        self._task = self.progress.add_task(escape(name), total=total_rows, rate="")
        return self._advance

    def finish_dataset(self) -> None:
        """Fills the bar: a total counted ahead may include blank lines, or max_prompts cut it short."""
        if self._task is not None:
            completed = self.progress.tasks[self._task].completed
            self.progress.update(self._task, total=completed, description=escape(self._name))
            self._task = None

    def waiting(self, queue: str, depth: int, limit: int) -> None:
        note = f"waiting: queue {queue} is {depth:,} deep (--max-queue-depth {limit:,})"
        if self._task is not None:
            self.progress.update(self._task, description=f"{escape(self._name)} [yellow]{note}[/]")
        now = time.monotonic()
        if not self.live and (not self._waiting or now - self._last_note >= WAIT_NOTE_EVERY_S):
            self.console.print(f"{escape(self._name)}: {note}")
            self._last_note = now
        self._waiting = True

    def _advance(self, rows: int) -> None:
        if self._task is None:
            return
        task = self.progress.tasks[self._task]
        elapsed = max(time.monotonic() - self._started, 1e-9)
        self.progress.update(self._task, advance=rows, description=escape(self._name),
                             rate=f"{(task.completed + rows) / elapsed:,.0f} rows/s")
        self._waiting = False
