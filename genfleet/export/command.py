"""`genfleet export`: its options, and what it shows on the console.

What `genfleet export` shows: a progress bar per phase (on a terminal only: `genfleet.progress`) and
the findings on stderr, the summary table on stdout (the command reads them from the manifest it just
wrote).

`genfleet export`: the command around `genfleet.export.exporter` (options, Redis, format, progress,
report, the dataset card, the push to the Hub). Every format is built through the one registry,
`formats.FORMATS`.
"""
from __future__ import annotations

import importlib.util
import json
import time
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import TaskID
from rich.table import Table

from genfleet.export.formats import FORMATS, BuiltFormat, FormatInputs
from genfleet.onebox.embedded_redis import reach_redis
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


if TYPE_CHECKING:
    from genfleet.export.exporter import ExportOptions, ExportReport
    from genfleet.export.reconcile import Reconciler, RunLedger

# Exit codes a script can tell apart (typer's own usage errors exit 2).
EXIT_INCOMPLETE = 1  # written, but reconciliation found prompts without a record (see manifest.json)
EXIT_ABORTED = 3  # stopped: a corrupt shard, a record the format cannot express, Redis unreachable
EXIT_PUSH_FAILED = 4  # written, complete and verified as asked, but --push-to-hub's upload failed


def export_command(
    run: Annotated[str, typer.Option(help="Run id")],
    from_dirs: Annotated[list[Path], typer.Option(
        "--from", exists=True, file_okay=False,
        help="An output root holding {run}/{dataset}/*.jsonl; repeat for shards copied from several hosts")],
    out: Annotated[Path, typer.Option(help="Export directory (must be new or empty)")],
    format_name: Annotated[str, typer.Option("--format", help=f"One of {', '.join(FORMATS)}")],
    tokenizer: Annotated[Optional[Path], typer.Option(
        help="tokenized: the model's tokenizer directory (default: the run's, from Redis)")] = None,
    trust_remote_code: Annotated[bool, typer.Option(
        "--trust-remote-code", help="tokenized: run the tokenizer's own code (auto_map), as the servers' flag "
                                    "(default: as the run was enqueued)")] = False,
    chat_template_kwargs: Annotated[Optional[str], typer.Option(
        help='tokenized: JSON for every dataset, e.g. \'{"thinking": false}\' (default: as enqueued)')] = None,
    drop_truncated: Annotated[bool, typer.Option(
        "--drop-truncated", help="Leave out completions cut at max_new_tokens")] = False,
    drop_looped: Annotated[bool, typer.Option(
        "--drop-looped", help="Leave out completions the loop guard stopped or flagged (finish_reason loop)")] = False,
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
    shuffle_buffer_mb: Annotated[int, typer.Option(
        help="Memory for one bucket read back from disk (the shuffle's, and grouping samples by prompt)")] = 256,
    reconcile: Annotated[bool, typer.Option(
        help="Check the shards against the run in Redis; --no-reconcile for shards without their Redis")] = True,
    redis_url: Annotated[Optional[str], typer.Option(help="Default: GENFLEET_REDIS_URL")] = None,
    push_to_hub: Annotated[Optional[str], typer.Option(
        "--push-to-hub", metavar="REPO",
        help="Upload the export (card included) to this Hugging Face dataset repo, owner/name; token: HF_TOKEN "
             "or `hf auth login`")] = None,
    private: Annotated[bool, typer.Option(
        "--private", help="--push-to-hub: create the repo private (an existing repo keeps its visibility)")] = False,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="--push-to-hub: list the files it would upload, with their sizes; upload nothing")] = False,
) -> None:
    """Export a run's shards (deduped, filtered, reconciled) as one training-ready dataset with a
    manifest and a Hugging Face dataset card (README.md). Exit 0: complete and verified; 1: written but
    incomplete (missing records, see manifest.json and missing.jsonl; never pushed); 3: stopped on an
    error naming its file and line; 4: --push-to-hub's upload failed."""
    from genfleet.export.exporter import ExportOptions
    from genfleet.export.records import RecordFilters

    _check_options(format_name, max_records_per_file, shuffle_buffer_mb, per_dataset, merged)
    _check_push_options(push_to_hub, private, dry_run)
    # Findings go to stderr unwrapped, so a file:line in them stays whole for grep and scripts.
    err = Console(stderr=True, soft_wrap=True)
    options = ExportOptions(
        run=run, sources=tuple(from_dirs), out=out, format=format_name,
        filters=RecordFilters(drop_truncated=drop_truncated, require_reasoning=require_reasoning,
                              min_content_chars=min_content_chars, drop_looped=drop_looped),
        shuffle=shuffle, seed=seed,
        max_records_per_file=max_records_per_file, per_dataset=per_dataset, merged=merged,
        shuffle_buffer_bytes=shuffle_buffer_mb << 20,
    )
    with ExitStack() as stack:
        # The run's Redis, up while the export reads it: --redis-url, GENFLEET_REDIS_URL, or the
        # embedded one of a `genfleet run` job on one of the --from directories.
        ledger, reconciler = (_open_run(err, run, stack.enter_context(reach_redis(redis_url, *from_dirs)))
                              if reconcile else (None, None))
        built = _build_format(format_name, FormatInputs(ledger, tokenizer, chat_template_kwargs, trust_remote_code))
        started = time.monotonic()
        report = _export(err, options, built, ledger, reconciler)
    _show(err, report, started)
    if not report.complete:
        if push_to_hub:
            err.print("[bold red]not pushed[/]: the export is incomplete")
        raise typer.Exit(EXIT_INCOMPLETE)
    if push_to_hub:
        _push(err, out, push_to_hub, private=private, dry_run=dry_run, run=run)


def _check_options(format_name: str, max_records_per_file: int | None, shuffle_buffer_mb: int,
                   per_dataset: bool, merged: bool) -> None:
    if format_name not in FORMATS:
        raise typer.BadParameter(f"--format must be one of {', '.join(FORMATS)}, not {format_name!r}")
    if max_records_per_file is not None and max_records_per_file < 1:
        raise typer.BadParameter("--max-records-per-file must be at least 1")
    if shuffle_buffer_mb < 1:
        raise typer.BadParameter("--shuffle-buffer-mb must be at least 1")
    if not (per_dataset or merged):
        raise typer.BadParameter("--no-per-dataset and --no-merged together leave nothing to write")


def _check_push_options(repo: str | None, private: bool, dry_run: bool) -> None:
    """Before anything is exported: a push that could not happen as asked stops the command now."""
    if repo is None:
        if dry_run or private:
            raise typer.BadParameter(f"{'--dry-run' if dry_run else '--private'} goes with --push-to-hub REPO")
        return
    from genfleet.export.hub import check_repo_id

    try:
        check_repo_id(repo)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None


def _open_run(err: Console, run: str, url: str) -> tuple[RunLedger, Reconciler]:
    """The run as Redis holds it, to reconcile the shards against; aborts if Redis cannot say."""
    import redis

    from genfleet.common.run_state import RunState
    from genfleet.common.settings import printable_url
    from genfleet.export.reconcile import Reconciler, RunLedger

    try:
        # Fail fast: a worker's client rides out a Redis restart for minutes, a command should not.
        state = RunState(redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=60), run)
        datasets = state.datasets()
    except Exception as error:  # noqa: BLE001 - any Redis failure: say where, and the way out
        _abort(err, f"cannot read run {run!r} from Redis at {printable_url(url)}: {error}; pass --no-reconcile "
                    "to export shards without their Redis")
    if not datasets:
        _abort(err, f"Redis at {printable_url(url)} has no run {run!r}; pass --no-reconcile to export shards "
                    "without their Redis")
    ledger = RunLedger.read(state)
    return ledger, Reconciler(state, ledger)


def _build_format(format_name: str, inputs: FormatInputs) -> BuiltFormat:
    try:
        return FORMATS[format_name].build(inputs)
    except (ValueError, OSError) as error:  # bad JSON, no tokenizer, a directory that is not one
        raise typer.BadParameter(str(error)) from None


def _export(err: Console, options: ExportOptions, built: BuiltFormat, ledger: RunLedger | None,
            reconciler: Reconciler | None) -> ExportReport:
    """Runs the export under progress bars; the manifest is written even when it stops on an error."""
    from genfleet.common.shards import ShardError
    from genfleet.export.exporter import Exporter, ExportError
    from genfleet.export.hub import write_card_and_manifest

    out = options.out
    with RichProgress(err) as progress:
        exporter = Exporter(options, built.formatter, ledger=ledger, reconciler=reconciler, progress=progress)
        try:
            return exporter.run(lambda r: write_card_and_manifest(r, ledger, built.tokenizer_dir))
        except (ExportError, ShardError, OSError) as error:
            written = exporter.report.error is not None  # the export had begun: its manifest says how far
            _abort(err, f"{error}\nwhat was written is listed in {out / 'manifest.json'}, marked incomplete"
                   if written else str(error))


def _show(err: Console, report: ExportReport, started: float) -> None:
    """The summary and stats tables on stdout, the findings on stderr, all read back from the manifest."""
    from genfleet.status.render import wide_console

    out = report.options.out
    console = wide_console()
    manifest = json.loads((out / "manifest.json").read_text())
    console.print(summary_table(manifest, time.monotonic() - started))
    console.print(report.stats.table(
        f"completion tokens · run {escape(report.options.run)} (unique records, before filters)"))
    if importlib.util.find_spec("matplotlib") is None:
        err.print("no stats.png: matplotlib is not installed (pip install 'genfleet[plots]')", markup=False)
    print_findings(err, manifest, out)


def _push(err: Console, out: Path, repo: str, *, private: bool, dry_run: bool, run: str) -> None:
    """Uploads the export, or with --dry-run lists what would go (stdout: one `path  bytes` line each)."""
    from genfleet.export.hub import PushError, push, upload_plan

    if dry_run:
        plan = upload_plan(out)
        for planned in plan:
            typer.echo(f"{planned.path}\t{planned.bytes}")
        total = sum(planned.bytes for planned in plan)
        err.print(f"dry run: would upload {len(plan)} files ({total:,} bytes) to the dataset repo {escape(repo)}; "
                  "nothing sent")
        return
    try:
        url = push(out, repo, private=private, run=run)
    except PushError as error:
        err.print(f"[bold red]push to the Hub failed[/]: {escape(str(error))}; the export in {escape(str(out))} is "
                  f"complete: upload it with `hf upload {escape(repo)} {escape(str(out))} --repo-type dataset`")
        raise typer.Exit(EXIT_PUSH_FAILED) from None
    err.print(f"pushed to the dataset repo {escape(repo)}: {escape(url)}")


def _abort(err: Console, message: str) -> NoReturn:
    err.print(f"[bold red]export failed[/]: {escape(message)}")
    raise typer.Exit(EXIT_ABORTED)
