"""Progress bars of the operator tools (`export`, `requeue`): a rate and an ETA, drawn on stderr and
only when stderr is a terminal, so a script's or a test's captured output holds the command's own
lines and nothing else (rich would otherwise print the bars' last frame into a pipe once they stop,
rich 15.0.0 `live.py` `Live.refresh`).
"""
from __future__ import annotations

from rich.console import Console
from rich.filesize import decimal
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

BYTES = "bytes"  # a task field: the task counts bytes (its rate reads MB/s), not items


def on_terminal(console: Console) -> bool:
    """Whether the console writes to a terminal (its file's isatty; rich's own notion also follows
    FORCE_COLOR and TTY_COMPATIBLE, which would draw bars into a CI log)."""
    isatty = getattr(console.file, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed file
        return False


class RateColumn(ProgressColumn):
    """Items (or bytes, for a task with `unit=BYTES`) per second over rich's recent window."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        if speed is None:
            return Text("", style="progress.data.speed")
        if task.fields.get("unit") == BYTES:
            return Text(f"{decimal(int(speed))}/s", style="progress.data.speed")
        return TaskProgressColumn.render_speed(speed)


def terminal_progress(console: Console, *, detail: bool = False, transient: bool = False) -> Progress:
    """description, bar, done/total (or the task's `detail` field), rate, elapsed, ETA; disabled
    (draws nothing) unless `console` writes to a terminal."""
    counts = TextColumn("{task.fields[detail]}") if detail else TextColumn("{task.completed:,.0f}/{task.total:,.0f}")
    return Progress(TextColumn("{task.description}"), BarColumn(), counts, RateColumn(), TimeElapsedColumn(),
                    TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=transient,
                    disable=not on_terminal(console))
