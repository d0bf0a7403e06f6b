"""Fitting `genfleet status` to a terminal: the console it prints on, tables that fit its width, and
a terminal that does not echo keys while `--watch` redraws.

The console takes the terminal's own width, read again at each render so `--watch` follows a
resize; into a pipe or a file it is 120 columns (220 with `--wide`). A `FittedTable` drops its
least needed columns, then ellipsises its first one (the names) in the middle, until it fits the
width it is rendered at: a row is never wrapped. Why it matters: a wrapped row splits a dataset's
numbers over two lines, and under `--watch` anything that moves the cursor behind rich's back (a
line wider than the terminal, an echoed Enter) breaks the redraw in place, since `Live` moves the
cursor up by the lines it rendered (`LiveRender.position_cursor`, rich/live_render.py, rich 15.0.0).
"""
from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from rich.box import Box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, JustifyMethod, RenderResult
from rich.table import Table
from rich.text import Text

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
