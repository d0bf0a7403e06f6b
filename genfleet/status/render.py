"""How `genfleet status` shows a `RunStatus`: a rich table (one row per dataset with progress, rates
over the last 1 and 10 minutes, completion lengths, quality shares (truncated, looped, empty
reasoning) and ETA; one per partition; the
upstreams; alarms in red) and the same as one JSON object. No Redis here.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from genfleet.status.alarms import DEFAULT_ALARMS, AlarmSettings, alarms
from genfleet.status.eta import FLEET, Eta
from genfleet.status.snapshot import DatasetStatus, LengthStats, RunStatus, Throughput


# --- table -------------------------------------------------------------------------------------
def render(status: RunStatus, settings: AlarmSettings = DEFAULT_ALARMS) -> RenderableType:
    parts: list[RenderableType] = [dataset_table(status), partition_table(status)]
    if status.upstreams:
        parts.append(Text("upstreams: " + " · ".join(
            f"{u.url} {'DOWN' if u.down_in else 'up'} ({u.workers} workers, {u.in_flight} in flight)"
            for u in status.upstreams)))
    if any(row.eta is not None and row.eta.basis == FLEET and row.progress.pending for row in status.datasets):
        parts.append(Text("* ETA mostly from completion lengths seen fleet-wide: too few completions of its own yet",
                          style="dim"))
    parts += [Text.from_markup(f"[bold red]ALARM[/] [red]{escape(line)}[/]") for line in alarms(status, settings)]
    return Group(*parts)


def dataset_table(status: RunStatus) -> Table:
    totals = status.totals.progress
    title = (f"run {status.run} · {totals.done:,}/{totals.total:,} done · {status.workers} workers"
             + (f" · ETA {_eta(status.totals.eta)}" if not status.finished else " · finished"))
    table = Table(title=title, title_justify="left")
    for column in ("dataset", "partition", "total", "done", "in flight", "failed", "rejected", "skipped",
                   "req/min 1m·10m", "tok/s 1m·10m", "tokens p50·mean·p99", "trunc %", "loop %", "empty reas. %",
                   "ETA"):
        table.add_column(column, justify="left" if column in ("dataset", "partition") else "right")
    rows = status.datasets + ([status.totals] if len(status.datasets) > 1 else [])
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


def partition_table(status: RunStatus) -> Table:
    table = Table(title="partitions (queues are shared by all runs)", title_justify="left")
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


def _alert(count: int) -> str:
    return f"[red]{count:,}[/]" if count else "0"


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


def wide_console() -> Console:
    """The table needs ~215 columns with a million-prompt run's numbers; a pipe or a log file gets
    them, a terminal keeps its width."""
    console = Console()
    return console if console.is_terminal else Console(width=220)


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
