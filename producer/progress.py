"""The live view while enqueueing: a rich progress bar per dataset (rows read, rate), and a note when
the producer waits for a queue to drain (`--max-queue-depth`). Without a terminal, plain lines."""
from __future__ import annotations

import time
from collections.abc import Callable

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
from typing_extensions import Self

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
