"""The tables `genfleet enqueue` ends with: what was enqueued, already there, skipped or rejected;
and for `--dry-run`, prompts, token statistics and queue memory per dataset and partition."""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from genfleet.common.queues import PARTITIONS
from genfleet.producer.dry_run import queue_memory_bytes
from genfleet.producer.report import DatasetReport, rejection_kind

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
