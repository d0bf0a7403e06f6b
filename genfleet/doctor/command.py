"""`genfleet doctor`: the preflight, as one table (or `--json`); exit status 0 when nothing failed
(warnings allowed), 1 when something did, 2 for a bad flag or run file."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from genfleet.doctor.checks import Check, Status, passed
from genfleet.doctor.plan import DoctorFlags, PreflightError, resolve_preflight
from genfleet.doctor.preflight import run_checks
from genfleet.producer.run_config import RunFileError
from genfleet.workers.cli import usage_error

STYLES = {Status.OK: "green", Status.WARN: "yellow", Status.FAIL: "bold red"}


def doctor_command(
    upstream: Annotated[Optional[list[str]], typer.Option(
        help="SGLang base URL the workers will use; repeat per host (default: GENFLEET_UPSTREAMS)")] = None,
    run_file: Annotated[Optional[Path], typer.Option(
        help="The run's TOML file: its tokenizer, datasets, queue depth, context length, thinking")] = None,
    tokenizer: Annotated[Optional[str], typer.Option(
        help="The model's local tokenizer directory (default: the run file's, else GENFLEET_TOKENIZER)")] = None,
    redis_url: Annotated[Optional[str], typer.Option(help="Default: the run file's, else GENFLEET_REDIS_URL")] = None,
    output_dir: Annotated[Optional[Path], typer.Option(help="Where workers write shards (GENFLEET_OUTPUT_DIR)")] = None,
    reasoning_parser: Annotated[Optional[str], typer.Option(
        help="The parser the workers split with (GENFLEET_REASONING_PARSER)")] = None,
    max_queue_depth: Annotated[Optional[int], typer.Option(
        help="Per queue, as `genfleet enqueue` will use it (default: the run file's, the setting's, 15,000/3,200)")]
        = None,
    prompt_tokens: Annotated[int, typer.Option(
        help="Typical prompt length in tokens, to plan Redis memory for the queued prompts")] = 2048,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of the table")] = False,
) -> None:
    """Preflight before a long run: Redis, upstreams, tokenizer and chat template, output dir, clocks."""
    flags = DoctorFlags(upstreams=tuple(upstream or ()), run_file=run_file, redis_url=redis_url,
                        output_dir=output_dir, tokenizer=tokenizer, reasoning_parser=reasoning_parser,
                        max_queue_depth=max_queue_depth, prompt_tokens=prompt_tokens)
    try:
        preflight = resolve_preflight(flags)
    except (PreflightError, RunFileError) as error:
        usage_error(str(error))
    checks = run_checks(preflight)
    if as_json:
        print(json.dumps({"passed": passed(checks), "checks": [check.to_dict() for check in checks]}))
    else:
        console = Console()
        # A pipe or a log gets the whole width of each detail; a terminal keeps its own width.
        (console if console.is_terminal else Console(width=200)).print(render(checks))
    if not passed(checks):
        raise typer.Exit(1)


def render(checks: list[Check]) -> Table:
    counts = {status: sum(check.status is status for check in checks) for status in Status}
    table = Table(title="genfleet doctor", title_justify="left",
                  caption=f"{counts[Status.OK]} ok, {counts[Status.WARN]} warnings, {counts[Status.FAIL]} failed",
                  caption_justify="left")
    for column in ("check", "result", "detail", "fix"):
        table.add_column(column, overflow="fold")
    for check in checks:
        # Text, not markup: details quote templates and tokens such as "[EOS]".
        table.add_row(Text(check.name), Text(check.status.value.upper(), style=STYLES[check.status]),
                      Text(check.detail), Text(check.fix))
    return table
