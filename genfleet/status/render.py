"""How `genfleet status` shows a `RunStatus`: as tables, and as one JSON object. No Redis here.

Two layouts of the same numbers. The default fits the terminal (`terminal.FittedTable`): per
dataset, progress done/total and %, failed (dead-lettered), the last minute's req/min and tok/s,
the truncated, looped and empty-reasoning shares and the ETA, with counts shortened (812.3k) and
the least needed columns dropped where the terminal is narrow. `--wide` shows everything: exact
counts, in flight, rejected, skipped, the partitions' share, rates over the last 1 and 10 minutes
and completion lengths. Both add the partitions, the upstreams and the alarms in red.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from genfleet.status.alarms import DEFAULT_ALARMS, AlarmSettings, alarms
from genfleet.status.eta import FLEET, Eta
from genfleet.status.snapshot import DatasetProgress, DatasetStatus, LengthStats, PartitionStatus, RunStatus, Throughput
from genfleet.status.terminal import Column, FittedTable, texts
from genfleet.status.terminal import wide_console as wide_console  # the demo and export print on it

_PARTITIONS_TITLE = "partitions (queues are shared by all runs)"


# --- tables ------------------------------------------------------------------------------------
def render(status: RunStatus, settings: AlarmSettings = DEFAULT_ALARMS, *, wide: bool = False) -> RenderableType:
    """The fitted tables, or with `wide` every column (rich wraps cells on a terminal too narrow)."""
    parts: list[RenderableType] = ([dataset_table(status), partition_table(status)] if wide
                                   else [fitted_dataset_table(status), fitted_partition_table(status)])
    if status.upstreams:
        parts.append(Text("upstreams: " + " · ".join(
            f"{u.url} {'DOWN' if u.down_in else 'up'} ({u.workers} workers, {u.in_flight} in flight)"
            for u in status.upstreams)))
    if any(row.eta is not None and row.eta.basis == FLEET and row.progress.pending for row in status.datasets):
        parts.append(Text("* ETA mostly from completion lengths seen fleet-wide: too few completions of its own yet",
                          style="dim"))
    parts += [Text.from_markup(f"[bold red]ALARM[/] [red]{escape(line)}[/]") for line in alarms(status, settings)]
    return Group(*parts)


def fitted_dataset_table(status: RunStatus) -> FittedTable:
    """What an operator looks at first. Where the terminal is narrow the columns go in `drop_rank`
    order: the empty-reasoning and loop shares first (their alarms still show), then req/min (tok/s
    tells the pace), the truncated share, failed, tok/s, and the progress % last."""
    rows = _dataset_rows(status)

    def column(header: str, cell: Callable[[DatasetStatus], str | Text], drop_rank: int = 0) -> Column:
        return Column(header, texts([cell(row) for row in rows]), drop_rank)

    columns = [
        Column("dataset", [Text(row.name) for row in rows], justify="left"),
        column("done/total", lambda r: f"{short_count(r.progress.done)}/{short_count(r.progress.total)}"),
        column("%", lambda r: _done_percent(r.progress), drop_rank=7),
        column("failed", lambda r: _alert(r.progress.failed, short_count(r.progress.failed)), drop_rank=5),
        column("req/min\n1m", lambda r: _rate(r.rates["1m"].req_per_min), drop_rank=3),
        column("tok/s\n1m", lambda r: _rate(r.rates["1m"].tok_per_s), drop_rank=6),
        column("trunc %", lambda r: _percent(r.progress.truncated, r.progress.done), drop_rank=4),
        column("loop %", lambda r: _percent(r.progress.looped, r.progress.done), drop_rank=2),
        column("empty\nreas. %", lambda r: _percent(r.progress.empty_reasoning, r.progress.done), drop_rank=1),
        column("ETA", lambda r: _eta(r.eta) if r.progress.pending else "done"),
    ]
    totals_row = frozenset({len(status.datasets) - 1}) if len(rows) > len(status.datasets) else frozenset()
    return FittedTable(_title(status), columns, section_ends=totals_row)


def fitted_partition_table(status: RunStatus) -> FittedTable:
    parts = status.partitions

    def column(header: str, cell: Callable[[PartitionStatus], str]) -> Column:
        return Column(header, texts([cell(p) for p in parts]))

    return FittedTable(_PARTITIONS_TITLE, [
        Column("partition", [Text(p.partition) for p in parts], justify="left"),
        column("queued", lambda p: short_count(p.queued)),
        column("in flight\n/ slots", lambda p: f"{short_count(p.in_flight)}/{short_count(p.slots)}"),
        column("workers", lambda p: str(p.workers)),
        column("req/min\n1m", lambda p: _rate(p.rates["1m"].req_per_min)),
        column("tok/s\n1m", lambda p: _rate(p.rates["1m"].tok_per_s)),
    ])


def dataset_table(status: RunStatus) -> Table:
    """Every column, exact counts (`--wide`)."""
    table = Table(title=_title(status), title_justify="left")
    for column in ("dataset", "partition", "total", "done", "in flight", "failed", "rejected", "skipped",
                   "req/min 1m·10m", "tok/s 1m·10m", "tokens p50·mean·p99", "trunc %", "loop %", "empty reas. %",
                   "ETA"):
        table.add_column(column, justify="left" if column in ("dataset", "partition") else "right")
    rows = _dataset_rows(status)
    for row in rows:
        d = row.progress
        table.add_row(
            escape(d.dataset), _partitions(row), f"{d.total:,}", f"{d.done:,}", f"{row.in_flight:,}",
            _alert(d.failed), f"{d.rejected:,}", f"{d.skipped:,}",
            _pair(row.rates, lambda t: t.req_per_min), _pair(row.rates, lambda t: t.tok_per_s),
            _lengths(row.lengths), _percent(d.truncated, d.done), _percent(d.looped, d.done),
            _percent(d.empty_reasoning, d.done),
            _eta(row.eta) if d.pending else "done",
            end_section=row is status.totals or row is rows[-1],
        )
    return table


def _dataset_rows(status: RunStatus) -> list[DatasetStatus]:
    return status.datasets + ([status.totals] if len(status.datasets) > 1 else [])


def _title(status: RunStatus) -> str:
    totals = status.totals.progress
    return (f"run {status.run} · {totals.done:,}/{totals.total:,} done · {status.workers} workers"
            + (f" · ETA {_eta(status.totals.eta)}" if not status.finished else " · finished"))


def partition_table(status: RunStatus) -> Table:
    table = Table(title=_PARTITIONS_TITLE, title_justify="left")
    for column in ("partition", "queued", "in flight", "slots", "workers", "req/min 1m·10m", "tok/s 1m·10m"):
        table.add_column(column, justify="left" if column == "partition" else "right")
    for p in status.partitions:
        table.add_row(p.partition, f"{p.queued:,}", f"{p.in_flight:,}", f"{p.slots:,}", str(p.workers),
                      _pair(p.rates, lambda t: t.req_per_min), _pair(p.rates, lambda t: t.tok_per_s))
    return table


def _partitions(row: DatasetStatus) -> str:
    done = row.done_by_partition
    if len(done) <= 1:
        return next(iter(done), "-")
    total = sum(done.values())
    return " ".join(f"{p} {100 * n / total:.0f}%" for p, n in done.items())


def _pair(rates: dict[str, Throughput], value: Any) -> str:
    return " · ".join(f"{value(rates[w]):,.0f}" for w in ("1m", "10m"))


def _lengths(stats: LengthStats) -> str:
    if not stats.samples:
        return "-"
    return " · ".join(f"{v:,.0f}" for v in (stats.median, stats.mean, stats.p99) if v is not None)


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}" if whole else "-"


def _alert(count: int, shown: str | None = None) -> str:
    shown = f"{count:,}" if shown is None else shown
    return f"[red]{shown}[/]" if count else "0"


def _done_percent(d: DatasetProgress) -> str:
    """Rounded down: 100.0 only once every prompt is done."""
    return f"{1000 * d.done // d.total / 10:.1f}" if d.total else "-"


def _rate(value: float) -> str:
    return short_count(round(value))


def short_count(count: int) -> str:
    """At most six characters: exact below 100,000, then thousands (k) or millions (M)."""
    if count < 100_000:
        return f"{count:,}"
    if count < 999_950:
        return f"{count / 1e3:.1f}k"
    if count < 9_995_000:
        return f"{count / 1e6:.2f}M"
    return f"{count / 1e6:.1f}M" if count < 99_950_000 else f"{count / 1e6:,.0f}M"


def _eta(eta: Eta | None) -> str:
    if eta is None:
        return "?"
    mark = "*" if eta.basis == FLEET else ""
    low, high = duration(eta.low_s), duration(eta.high_s)
    return f"{low}{mark}" if low == high else f"{low}–{high}{mark}"


def duration(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
    return f"{int(seconds // 86400)}d{int(seconds % 86400 // 3600):02d}h"


# --- JSON --------------------------------------------------------------------------------------
def status_json(status: RunStatus, settings: AlarmSettings = DEFAULT_ALARMS) -> dict[str, Any]:
    return {
        "run": status.run, "time": status.time, "finished": status.finished,
        "created_at": status.created_at, "first_finished": status.first_finished,
        "last_finished": status.last_finished, "workers": status.workers,
        "queued": status.progress.queued, "unacked": status.progress.unacked,
        "unaccounted": status.unaccounted,
        "datasets": [dataset_json(row) for row in status.datasets],
        "totals": dataset_json(status.totals),
        "partitions": [{"partition": p.partition, "queued": p.queued, "in_flight": p.in_flight, "slots": p.slots,
                        "workers": p.workers, "rates": _rates_json(p.rates)} for p in status.partitions],
        "upstreams": [asdict(u) for u in status.upstreams],
        "alarms": alarms(status, settings),
    }


def dataset_json(row: DatasetStatus) -> dict[str, Any]:
    d = row.progress
    return {
        **asdict(d), "pending": d.pending, "in_flight": row.in_flight, "done_by_partition": row.done_by_partition,
        "rates": _rates_json(row.rates),
        "completion_tokens_stats": asdict(row.lengths),
        "truncated_pct": _share_pct(d.truncated, d.done),
        "looped_pct": _share_pct(d.looped, d.done),
        "empty_reasoning_pct": _share_pct(d.empty_reasoning, d.done),
        "eta": asdict(row.eta) if row.eta is not None else None,
    }


def _share_pct(part: int, whole: int) -> float | None:
    return round(100 * part / whole, 2) if whole else None


def _rates_json(rates: dict[str, Throughput]) -> dict[str, Any]:
    return {window: {"req_per_min": round(t.req_per_min, 3), "tok_per_s": round(t.tok_per_s, 3),
                     "stream_tok_per_s": round(t.stream_tok_s, 3), "errors": round(t.errors, 3),
                     "error_share": t.error_share} for window, t in rates.items()}
