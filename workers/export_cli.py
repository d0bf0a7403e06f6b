"""`genfleet export`: the command around `workers.export` (options, Redis, tokenizer, progress, report)."""
from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from workers.export_formats import FORMATS, RecordFormatter

if TYPE_CHECKING:
    from workers.export_reconcile import RunLedger

# Exit codes a script can tell apart (typer's own usage errors exit 2).
EXIT_INCOMPLETE = 1  # written, but reconciliation found prompts without a record (see manifest.json)
EXIT_ABORTED = 3  # stopped: a corrupt shard, a record the format cannot express, Redis unreachable


def export_command(
    run: Annotated[str, typer.Option(help="Run id")],
    from_dirs: Annotated[list[Path], typer.Option(
        "--from", exists=True, file_okay=False,
        help="An output root holding {run}/{dataset}/*.jsonl; repeat for shards copied from several hosts")],
    out: Annotated[Path, typer.Option(help="Export directory (must be new or empty)")],
    format_name: Annotated[str, typer.Option("--format", help=f"One of {', '.join(FORMATS)}")],
    tokenizer: Annotated[Optional[Path], typer.Option(
        help="tokenized: the model's tokenizer directory (default: the run's, from Redis)")] = None,
    chat_template_kwargs: Annotated[Optional[str], typer.Option(
        help='tokenized: JSON for every dataset, e.g. \'{"thinking": false}\' (default: as enqueued)')] = None,
    drop_truncated: Annotated[bool, typer.Option(
        "--drop-truncated", help="Leave out completions cut at max_new_tokens")] = False,
    require_reasoning: Annotated[bool, typer.Option(
        "--require-reasoning", help="Leave out completions with empty reasoning")] = False,
    min_content_chars: Annotated[int, typer.Option(help="Leave out completions with less content than this")] = 0,
    shuffle: Annotated[bool, typer.Option(
        "--shuffle", help="Shuffle the records (bounded memory: see --shuffle-buffer-mb)")] = False,
    seed: Annotated[int, typer.Option(help="Shuffle seed: the same seed and shards give the same files")] = 0,
    max_records_per_file: Annotated[Optional[int], typer.Option(
        help="Split each output into numbered files of at most this many records")] = None,
    per_dataset: Annotated[bool, typer.Option(help="Write datasets/{dataset}.jsonl")] = True,
    merged: Annotated[bool, typer.Option(help="Write all.jsonl with every dataset")] = True,
    shuffle_buffer_mb: Annotated[int, typer.Option(help="Memory for one shuffle bucket")] = 256,
    reconcile: Annotated[bool, typer.Option(
        help="Check the shards against the run in Redis; --no-reconcile for shards without their Redis")] = True,
    redis_url: Annotated[Optional[str], typer.Option(help="Default: GENFLEET_REDIS_URL")] = None,
) -> None:
    """Export a run's shards (deduped, filtered, reconciled) as one training-ready dataset with a
    manifest. Exit 0: complete and verified; 1: written but incomplete (missing records, see
    manifest.json and missing.jsonl); 3: stopped on an error naming its file and line."""
    import redis

    from common.run_state import RunState
    from common.settings import get_settings
    from common.status import wide_console
    from workers.export import Exporter, ExportError, ExportOptions
    from workers.export_filters import RecordFilters
    from workers.export_manifest import build_manifest, write_manifest
    from workers.export_reconcile import Reconciler, RunLedger
    from workers.shard_reader import ShardError

    if format_name not in FORMATS:
        raise typer.BadParameter(f"--format must be one of {', '.join(FORMATS)}, not {format_name!r}")
    if max_records_per_file is not None and max_records_per_file < 1:
        raise typer.BadParameter("--max-records-per-file must be at least 1")
    if shuffle_buffer_mb < 1:
        raise typer.BadParameter("--shuffle-buffer-mb must be at least 1")
    if not (per_dataset or merged):
        raise typer.BadParameter("--no-per-dataset and --no-merged together leave nothing to write")
    # Findings go to stderr unwrapped, so a file:line in them stays whole for grep and scripts.
    console, err = wide_console(), Console(stderr=True, soft_wrap=True)

    ledger = reconciler = None
    if reconcile:
        url = redis_url or get_settings().redis_url
        try:
            # Fail fast: a worker's client rides out a Redis restart for minutes, a command should not.
            state = RunState(redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=60), run)
            datasets = state.datasets()
        except Exception as error:  # noqa: BLE001 - any Redis failure: say where, and the way out
            _abort(err, f"cannot read run {run!r} from Redis at {url}: {error}; pass --no-reconcile to export "
                        "shards without their Redis")
        if not datasets:
            _abort(err, f"Redis at {url} has no run {run!r}; pass --no-reconcile to export shards without their Redis")
        ledger = RunLedger.read(state)
        reconciler = Reconciler(state, ledger)

    try:
        formatter, tokenizer_dir = _formatter(format_name, ledger, tokenizer, chat_template_kwargs)
    except (ValueError, OSError) as error:  # bad JSON, no tokenizer, a directory that is not one
        raise typer.BadParameter(str(error)) from None

    options = ExportOptions(
        run=run, sources=tuple(from_dirs), out=out, format=format_name,
        filters=RecordFilters(drop_truncated, require_reasoning, min_content_chars), shuffle=shuffle, seed=seed,
        max_records_per_file=max_records_per_file, per_dataset=per_dataset, merged=merged,
        shuffle_buffer_bytes=shuffle_buffer_mb << 20,
    )
    started = time.monotonic()
    with RichProgress(err) as progress:
        exporter = Exporter(options, formatter, ledger=ledger, reconciler=reconciler, progress=progress)
        try:
            report = exporter.run(lambda r: write_manifest(out, build_manifest(r, ledger, tokenizer_dir)))
        except (ExportError, ShardError, OSError) as error:
            written = exporter.report.error is not None  # the export had begun: its manifest says how far
            _abort(err, f"{error}\nwhat was written is listed in {out / 'manifest.json'}, marked incomplete"
                   if written else str(error))

    manifest = json.loads((out / "manifest.json").read_text())
    console.print(_summary_table(manifest, time.monotonic() - started))
    console.print(report.stats.table(f"completion tokens · run {escape(run)} (unique records, before filters)"))
    if importlib.util.find_spec("matplotlib") is None:
        err.print("no stats.png: matplotlib is not installed (pip install 'genfleet[plots]')", markup=False)
    _print_findings(err, manifest, out)
    if not report.complete:
        raise typer.Exit(EXIT_INCOMPLETE)


def _formatter(format_name: str, ledger: RunLedger | None, tokenizer: Path | None,
               chat_template_kwargs: str | None) -> tuple[RecordFormatter, str | None]:
    """The record formatter for `format_name`, and the tokenizer directory it uses (if any)."""
    from common.keys import ManifestFields
    from common.reasoning import get_format
    from common.settings import get_settings
    from workers import export_formats

    if format_name == "specforge":
        return export_formats.specforge_line, None
    if format_name == "openai":
        return export_formats.openai_line, None
    if format_name == "openai-batch":
        return export_formats.openai_batch_line, None
    if format_name == "sharegpt":
        parser = (ledger.config.get("reasoning_parser") if ledger is not None else None) \
            or get_settings().reasoning_parser
        return export_formats.sharegpt_formatter(get_format(parser)), None
    from common.tokenizer import load_tokenizer
    from workers.export_tokenized import TokenizedFormat

    directory = str(tokenizer) if tokenizer is not None else (
        ledger.manifest.get(ManifestFields.TOKENIZER_DIR) if ledger is not None else None)
    if not directory:
        raise ValueError("--format tokenized needs --tokenizer DIR (the run in Redis records none)")
    default_kwargs = None
    if chat_template_kwargs is not None:
        default_kwargs = json.loads(chat_template_kwargs)
        if not isinstance(default_kwargs, dict):
            raise ValueError("--chat-template-kwargs must be a JSON object")
    per_dataset = ledger.chat_template_kwargs() if ledger is not None else {}
    return TokenizedFormat(load_tokenizer(directory), per_dataset, default_kwargs=default_kwargs), directory


class RichProgress:
    """A rich progress bar per phase, on stderr; updates are batched so a million records cost
    thousands of redraw requests, not millions."""

    _BATCH = 2048

    def __init__(self, console: Console) -> None:
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[detail]}"),
                                  TimeElapsedColumn(), TimeRemainingColumn(), console=console)
        self._task: TaskID | None = None
        self._pending = self._calls = 0
        self._unit_bytes = False

    def __enter__(self) -> RichProgress:
        self._progress.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._flush()
        self._progress.__exit__(kind, error, traceback)

    def phase(self, description: str, total: int | None) -> None:
        self._flush()
        if self._task is not None:  # the previous phase is over: show it full and stop its clock
            done = self._progress.tasks[-1].total or 1
            self._progress.update(self._task, total=done, completed=done)
            self._progress.stop_task(self._task)
        self._unit_bytes = description == "reading shards"
        self._calls = 0
        self._task = self._progress.add_task(description, total=total, detail="")

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
        detail = f"{done / 1e6:,.0f}/{(task.total or 0) / 1e6:,.0f} MB · {self._calls:,} records" \
            if self._unit_bytes else f"{done:,.0f}/{task.total or 0:,.0f}"
        self._progress.update(self._task, advance=self._pending, detail=detail)
        self._pending = 0


def _summary_table(manifest: dict[str, Any], elapsed_s: float) -> Table:
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


def _print_findings(err: Console, manifest: dict[str, Any], out: Path) -> None:
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
        err.print(f"all {reconciliation['missing_rows']} missing rows: {escape(str(out / reconciliation['missing_file']))}")
    state = "[green]complete and verified[/]" if manifest["verified"] else (
        "[green]complete[/] (not verified)" if manifest["complete"] else "[bold red]incomplete[/]")
    err.print(f"export {state}: {len(manifest['files'])} files, manifest {escape(str(out / 'manifest.json'))}")


def _abort(err: Console, message: str) -> NoReturn:
    err.print(f"[bold red]export failed[/]: {escape(message)}")
    raise typer.Exit(EXIT_ABORTED)
