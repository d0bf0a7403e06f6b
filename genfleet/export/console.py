"""What `genfleet export` shows: a progress bar per phase (on a terminal only: `genfleet.progress`) and
the findings on stderr, the summary table on stdout (the command reads them from the manifest it just
wrote)."""
from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import TaskID
from rich.table import Table

from genfleet.progress import BYTES, terminal_progress


class RichProgress:
    """A rich progress bar per phase, on stderr, with its rate and ETA (reading shards: over bytes read,
    the records counted beside them); updates are batched so a million records cost thousands of
    redraw requests, not millions."""

    _BATCH = 2048

    def __init__(self, console: Console) -> None:
        self._progress = terminal_progress(console, detail=True)
        self._task: TaskID | None = None
        self._pending = self._calls = 0
        self._unit_bytes = False

    def __enter__(self) -> RichProgress:
        self._progress.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._flush()
        if kind is None:
            self._end_phase()
        self._progress.__exit__(kind, error, traceback)

    def phase(self, description: str, total: int | None) -> None:
        self._flush()
        self._end_phase()
        self._unit_bytes = description == "reading shards"
        self._calls = 0
        self._task = self._progress.add_task(description, total=total, detail="",
                                             unit=BYTES if self._unit_bytes else "items")

    def _end_phase(self) -> None:
        """The phase is over: show it full and stop its clock."""
        if self._task is not None:
            done = self._progress.tasks[-1].total or 1
            self._progress.update(self._task, total=done, completed=done)
            self._progress.stop_task(self._task)

    def advance(self, amount: int) -> None:
        self._pending += amount
        self._calls += 1
        if self._calls % self._BATCH == 0:
            self._flush()

    def _flush(self) -> None:
        if self._task is None or not self._pending:
            return
        task = self._progress.tasks[-1]
        done = task.completed + self._pending
        elapsed = task.elapsed or 0.0
        records_rate = f" · {self._calls / elapsed:,.0f} records/s" if elapsed > 1 else ""
        detail = f"{done / 1e6:,.0f}/{(task.total or 0) / 1e6:,.0f} MB · {self._calls:,} records{records_rate}" \
            if self._unit_bytes else f"{done:,.0f}/{task.total or 0:,.0f}"
        self._progress.update(self._task, advance=self._pending, detail=detail)
        self._pending = 0


def summary_table(manifest: dict[str, Any], elapsed_s: float) -> Table:
    table = Table(title=f"export · run {escape(manifest['run'])} · {manifest['options']['format']} · {elapsed_s:.1f} s")
    columns = ("input", "done", "dead", "rejected", "skipped", "records", "duplicates_dropped", "filtered",
               "exported", "torn_lines")
    table.add_column("dataset")
    for column in columns:
        table.add_column(column.replace("_", " "), justify="right")
    datasets = list(manifest["datasets"].items())
    for index, (name, row) in enumerate([*datasets, ("all", manifest["totals"])]):
        table.add_row(escape(name), *("-" if row.get(c) is None else f"{row[c]:,}" for c in columns),
                      end_section=index == len(datasets) - 1)
    return table


def print_findings(err: Console, manifest: dict[str, Any], out: Path) -> None:
    for source in manifest["sources_without_run"]:
        err.print(f"[yellow]no shards of this run under[/] {escape(source)}")
    for torn in manifest["torn_lines"]:
        err.print(f"[yellow]torn last line tolerated[/] {escape(torn['file'])}:{torn['line']} ({torn['bytes']} bytes)")
    duplicates = manifest["duplicates"]
    if duplicates["dropped"]:
        shown = ", ".join(example["id"] for example in duplicates["examples"][:5])
        err.print(f"[yellow]{duplicates['dropped']} duplicate records dropped[/] (first kept), e.g. {escape(shown)}")
    reconciliation = manifest["reconciliation"]
    if not reconciliation["checked"]:
        err.print("[yellow]not reconciled[/] (--no-reconcile): nothing proves the shards hold every prompt")
    else:
        for finding in reconciliation["datasets"].values():
            for note in finding["notes"]:
                err.print(f"note: {escape(note)}")
    for problem in manifest["problems"]:
        err.print(f"[bold red]INCOMPLETE[/] {escape(problem)}")
    if reconciliation.get("missing_rows"):
        for finding in reconciliation["datasets"].values():
            for row in finding["missing_examples"]:
                what = row["id"] or f"{row['dataset']} row {row['row']}"
                err.print(f"  missing: {escape(what)} (row {row['row']}, {row['reason'].replace('_', ' ')})")
        missing_file = escape(str(out / reconciliation["missing_file"]))
        err.print(f"all {reconciliation['missing_rows']} missing rows: {missing_file}")
    state = "[green]complete and verified[/]" if manifest["verified"] else (
        "[green]complete[/] (not verified)" if manifest["complete"] else "[bold red]incomplete[/]")
    err.print(f"export {state}: {len(manifest['files'])} files, manifest {escape(str(out / 'manifest.json'))}")
