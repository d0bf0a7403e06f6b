"""How `status` shows a run: the table fitted to the terminal, and the JSON.

Fitting `genfleet status` to a terminal: the console it prints on, tables that fit its width, and
a terminal that does not echo keys while `--watch` redraws.

The console takes the terminal's own width, read again at each render so `--watch` follows a
resize; into a pipe or a file it is 120 columns (220 with `--wide`). A `FittedTable` drops its
least needed columns, then ellipsises its first one (the names) in the middle, until it fits the
width it is rendered at: a row is never wrapped. Why it matters: a wrapped row splits a dataset's
numbers over two lines, and under `--watch` anything that moves the cursor behind rich's back (a
line wider than the terminal, an echoed Enter) breaks the redraw in place, since `Live` moves the
cursor up by the lines it rendered (`LiveRender.position_cursor`, rich/live_render.py, rich 15.0.0).

How `genfleet status` shows a `RunStatus`: as tables, and as one JSON object. No Redis here.

Two layouts of the same numbers. The default fits the terminal (`terminal.FittedTable`): per
dataset, progress done/total and %, failed (dead-lettered), the last minute's req/min and tok/s,
the truncated, looped and empty-reasoning shares and the ETA, with counts shortened (812.3k) and
the least needed columns dropped where the terminal is narrow. `--wide` shows everything: exact
counts, in flight, rejected, skipped, the partitions' share, rates over the last 1 and 10 minutes
and completion lengths. Both add the partitions, the upstreams and the alarms in red.
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.box import Box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, JustifyMethod, RenderableType, RenderResult
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from genfleet.status.alarms import DEFAULT_ALARMS, AlarmSettings, alarms
from genfleet.status.eta import FLEET, Eta
from genfleet.status.read_model import (
    DatasetProgress,
    DatasetStatus,
    LengthStats,
    PartitionStatus,
    RunStatus,
    Throughput,
    UpstreamStatus,
)

STATUS_WIDTH = 120  # into a pipe or a file: the table without its detail columns
WIDE_WIDTH = 220  # `--wide` into a pipe: every column with a million-prompt run's numbers
# Columns apart: the collapsed one-space padding plus the blank divider (`RULES`, collapse_padding).
GAP = 2
# A name ellipsised to fewer characters than this is no longer recognisable: drop a column instead.
MIN_NAME_WIDTH = 12

# rich's SIMPLE_HEAD (rich/box.py, rich 15.0.0) with a rule at a section's end as well as under the
# header: it sets the totals row apart. No vertical lines: a column costs two characters, not three.
RULES = Box(
    "    \n"
    "    \n"
    " ── \n"
    "    \n"
    " ── \n"
    " ── \n"
    "    \n"
    "    \n"
)


def status_console(wide: bool = False) -> Console:
    """A terminal keeps its width (rich reads it at each render); a pipe or a file gets a fixed one."""
    console = Console()
    return console if console.is_terminal else Console(width=WIDE_WIDTH if wide else STATUS_WIDTH)


def wide_console() -> Console:
    """The console for tables that need every column (`status --wide`, the demo, export's tables)."""
    return status_console(wide=True)


@contextmanager
def keys_not_echoed() -> Iterator[None]:
    """While a table is redrawn in place, the terminal does not echo what is typed: an Enter, or the
    "^C" of Ctrl-C on the bottom line, would move the cursor down, and `Live`, moving back up by
    the lines it drew, would leave a copy of the table's top line above the next redraw. On exit
    the settings come back and what was typed meanwhile is dropped, not run by the shell."""
    try:
        import termios  # POSIX only
    except ImportError:
        yield
        return
    try:
        fd = sys.stdin.fileno()
        saved = termios.tcgetattr(fd)
    except (OSError, ValueError, termios.error):  # stdin is not a terminal
        yield
        return
    quiet = termios.tcgetattr(fd)
    quiet[3] &= ~(termios.ECHO | getattr(termios, "ECHOCTL", 0))  # lflag; ISIG stays: Ctrl-C still stops
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSAFLUSH, saved)


@dataclass(frozen=True)
class Column:
    header: str  # "\n" splits it over two lines, to keep a narrow column narrow
    cells: list[Text]  # one per row
    drop_rank: int = 0  # 0: always shown; others go when the width is short, rank 1 first
    justify: JustifyMethod = "right"

    @property
    def width(self) -> int:
        return max([cell_len(line) for line in self.header.split("\n")] + [cell.cell_len for cell in self.cells])


@dataclass(frozen=True)
class Fit:
    columns: list[Column]
    name_width: int  # what the first column may take
    hidden: list[Column]


@dataclass(frozen=True)
class FittedTable:
    """A table laid out anew for each width it is rendered at. The first column holds the names."""
    title: str
    columns: list[Column]
    section_ends: frozenset[int] = field(default_factory=frozenset)  # rows followed by a rule

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.table(options.max_width)

    def fit(self, width: int) -> Fit:
        names, *others = self.columns
        need = min(names.width, MIN_NAME_WIDTH)
        by_rank = sorted((i for i, c in enumerate(others) if c.drop_rank), key=lambda i: others[i].drop_rank)
        hidden: set[int] = set()

        def room() -> int:
            return width - sum(c.width + GAP for i, c in enumerate(others) if i not in hidden)

        for index in by_rank:
            if room() >= need:
                break
            hidden.add(index)
        # What a wide column freed may take back a narrower one dropped before it, most needed first.
        for index in reversed(by_rank):
            if index in hidden and room() - others[index].width - GAP >= need:
                hidden.remove(index)
        return Fit([names, *(c for i, c in enumerate(others) if i not in hidden)], max(min(names.width, room()), 1),
                   [c for i, c in enumerate(others) if i in hidden])

    def table(self, width: int) -> Table:
        fit = self.fit(width)
        caption = None
        if fit.hidden:
            caption = (", ".join(c.header.replace("\n", " ") for c in fit.hidden)
                       + f": hidden at {width} columns (--wide shows every column)")
        table = Table(title=self.title, title_justify="left", caption=caption, caption_justify="left",
                      box=RULES, show_edge=False, pad_edge=False, collapse_padding=True)
        for column in fit.columns:
            table.add_column(column.header, justify=column.justify, no_wrap=True)
        names, *others = fit.columns
        for row, name in enumerate(names.cells):
            table.add_row(shortened(name, fit.name_width), *(c.cells[row] for c in others),
                          end_section=row in self.section_ends)
        return table


def shortened(name: Text, width: int) -> Text:
    """Ellipsised in the middle: names that differ only at their end (…_shard_07) stay apart."""
    if name.cell_len <= width:
        return name
    tail = (width - 1) // 2
    plain = name.plain  # dataset names are ASCII (common/names.py): one cell per character
    return Text(plain[:width - 1 - tail] + "…" + (plain[-tail:] if tail else ""), style=name.style)


def texts(values: Sequence[str | Text]) -> list[Text]:
    """Cells as `Text` (markup read), so their width is known before the table is laid out."""
    return [value if isinstance(value, Text) else Text.from_markup(value) for value in values]


_PARTITIONS_TITLE = "partitions (queues are shared by all runs)"


def upstream_line(upstream: UpstreamStatus) -> str:
    """One host: health, streams, and with `--in-flight auto` the target and the server's own load."""
    text = f"{upstream.url} {'DOWN' if upstream.down_in else 'up'} ({upstream.workers} workers, " \
           f"{upstream.in_flight} in flight"
    if upstream.target is not None:
        text += f", target {upstream.target}"
    if (load := upstream.load) is not None:
        text += (f"; server {load.running} running, {load.waiting} waiting, KV {load.token_usage:.0%}, "
                 f"{load.retracted} retracted, {load.gen_throughput:,.0f} tok/s")
    return text + ")" + (" ADMISSION-BOUND" if upstream.admission_bound else "")


# --- tables ------------------------------------------------------------------------------------
def render(status: RunStatus, settings: AlarmSettings = DEFAULT_ALARMS, *, wide: bool = False) -> RenderableType:
    """The fitted tables, or with `wide` every column (rich wraps cells on a terminal too narrow)."""
    parts: list[RenderableType] = ([dataset_table(status), partition_table(status)] if wide
                                   else [fitted_dataset_table(status), fitted_partition_table(status)])
    if status.upstreams:
        parts.append(Text("upstreams: " + " · ".join(upstream_line(u) for u in status.upstreams)))
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
    return f"run {status.run} · {totals.done:,}/{totals.total:,} done · {status.workers} workers · {_state(status)}"


def _state(status: RunStatus) -> str:
    """Finished, nothing enqueued (every row rejected, or still being read), or the ETA."""
    if not status.totals.progress.total:
        return "nothing enqueued"
    return "finished" if status.finished else f"ETA {_eta(status.totals.eta)}"


@dataclass
class ProgressLog:
    """`genfleet run`'s progress without a terminal (a log, a pipe, nohup), readable over 50 hours:
    at every interval one total line (done/total, req/min, tok/s, failed, ETA); a dataset's line only
    where it changed since its last one (so one when it finishes, and none after); a host's line
    when workers find it down and when it answers again. A 10-dataset job then writes about as many
    lines an hour as intervals, not ten times that."""

    _shown: dict[str, tuple[int, int, int, str]] = field(default_factory=dict)  # dataset -> its last line's figures
    _down: dict[str, int] = field(default_factory=dict)  # upstream -> workers that found it down, at its last line

    def lines(self, status: RunStatus, clock: str) -> list[str]:
        """The lines for this interval; `clock` starts each (e.g. "12:00:05")."""
        lines = [f"{clock} {_progress_line('total', status.totals)}"]
        for row in status.datasets:
            d = row.progress
            figures = (d.done, d.failed, d.total, _line_state(row))
            if self._shown.get(d.dataset) != figures:
                self._shown[d.dataset] = figures
                lines.append(f"{clock} {_progress_line(d.dataset, row)}")
        for upstream in status.upstreams:
            down = upstream.down_in if upstream.workers else 0
            if down == self._down.get(upstream.url, 0):
                continue
            self._down[upstream.url] = down
            lines.append(f"{clock} upstream {upstream.url}: " + (
                f"down for {down} of {upstream.workers} workers (no answer: its prompts wait)" if down
                else "answers again"))
        return lines


def _progress_line(name: str, row: DatasetStatus) -> str:
    d, rates = row.progress, row.rates["1m"]
    return (f"{name}: {d.done:,}/{d.total:,} done ({_done_percent(d)}%) · {rates.req_per_min:,.0f} req/min · "
            f"{rates.tok_per_s:,.0f} tok/s · {d.failed:,} failed · {_line_state(row)}")


def _line_state(row: DatasetStatus) -> str:
    d = row.progress
    return "done" if d.total and not d.pending else ("waiting" if not d.total else f"ETA {_eta(row.eta)}")


def progress_bars(status: RunStatus) -> Table:
    """A bar per dataset with done/total and its ETA: the head of `genfleet run`'s live view."""
    from rich.progress_bar import ProgressBar

    table = Table.grid(padding=(0, 1))
    for row in _dataset_rows(status):
        d = row.progress
        table.add_row(escape(d.dataset), ProgressBar(total=max(d.total, 1), completed=d.done, width=30),
                      f"{d.done:,}/{d.total:,}", f"[red]{d.failed:,} failed[/]" if d.failed else "", _line_state(row))
    return table


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
        "upstreams": [{**asdict(u), "admission_bound": u.admission_bound} for u in status.upstreams],
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
