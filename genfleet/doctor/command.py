"""Runs every check in the order a run depends on its parts: its inputs, Redis, the output
directory, the tokenizer and its template, then each upstream and a test generation through it.
A check whose subject is missing (no tokenizer, an upstream down) stands in for the checks that
would need it: one failure, one row, not a cascade.

`genfleet doctor`: the preflight, as one table (or `--json`); exit status 0 when nothing failed
(warnings allowed), 1 when something did, 2 for a bad flag or run file.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from genfleet.common.reasoning import get_format
from genfleet.doctor.checks import (
    Check,
    Status,
    fail,
    generation_check,
    ok,
    output_dir_check,
    passed,
    probe_template,
    redis_checks,
    template_check,
    templating_rate_check,
    tokenizer_check,
    upstream_check,
    variant_label,
)
from genfleet.doctor.plan import DoctorFlags, Preflight, PreflightError, resolve_preflight
from genfleet.producer.readers import DatasetReadError, open_dataset
from genfleet.producer.run_config import (
    RunFileError,
)
from genfleet.workers.command import usage_error
from genfleet.workers.servers.kinds import AnyServer

# Stands in for the datasets when the run file names none, so `resolve` still merges the run file's
# chat template kwargs and `thinking` exactly as it would for a dataset. Never read.
TIMEOUT_S = 5.0


def run_checks(preflight: Preflight) -> list[Check]:
    settings = preflight.settings
    checks = dataset_checks(preflight.datasets)
    checks += redis_checks(preflight, timeout_s=TIMEOUT_S)
    checks.append(output_dir_check(settings.output_dir, min_free_disk_mb=settings.min_free_disk_mb))
    fmt = get_format(settings.reasoning_parser)
    tokenizer, tokenizer_row = tokenizer_check(settings.tokenizer, fmt, trust_remote_code=settings.trust_remote_code)
    checks.append(tokenizer_row)
    if tokenizer is not None:
        checks.append(templating_rate_check(tokenizer, preflight.datasets, preflight.variants))
    probes = []
    for variant in preflight.variants if tokenizer is not None else ():
        try:
            probes.append(probe_template(tokenizer, variant, fmt))
        except Exception as error:  # noqa: BLE001 - a template may raise anything jinja2 can
            checks.append(fail("chat template" + variant_label(variant), f"rendering failed: {error}",
                               "fix the chat_template in the tokenizer's tokenizer_config.json"))
            continue
        checks.append(template_check(probes[-1], fmt))
    if not settings.upstreams:
        return [*checks, fail("upstreams", "none given", "pass --upstream URL (once per host) or GENFLEET_UPSTREAMS")]
    server = AnyServer(max_connections=4, connect_timeout_s=min(settings.connect_timeout_s, TIMEOUT_S),
                       stall_timeout_s=30.0)
    try:
        for url in settings.upstreams:
            upstream, row = upstream_check(server, url, settings, preflight.context_length)
            checks.append(row)
            if upstream is not None:
                for probe in probes:
                    checks.append(generation_check(server, url, upstream.description.model.name, tokenizer, probe,
                                                   settings, fmt))
    finally:
        server.close()
    return checks


def dataset_checks(datasets: dict[str, str]) -> list[Check]:
    """The run file's datasets resolve to files the producer can read (their rows are not read)."""
    checks = []
    for name, source in datasets.items():
        try:
            files = open_dataset(source).files
        except DatasetReadError as error:
            checks.append(fail(f"dataset {name}", str(error), "fix its path in the run file"))
            continue
        kinds = sorted({kind.name for _, kind in files})
        checks.append(ok(f"dataset {name}", f"{source}: {len(files)} file(s), {', '.join(kinds)}"))
    return checks


STYLES = {Status.OK: "green", Status.WARN: "yellow", Status.FAIL: "bold red"}


def doctor_command(
    upstream: Annotated[Optional[list[str]], typer.Option(
        help="SGLang base URL the workers will use; repeat per host (default: GENFLEET_UPSTREAMS)")] = None,
    run_file: Annotated[Optional[Path], typer.Option(
        help="The run's TOML file: its tokenizer, datasets, queue depth, context length, thinking")] = None,
    tokenizer: Annotated[Optional[str], typer.Option(
        help="The model's local tokenizer directory (default: the run file's, else GENFLEET_TOKENIZER)")] = None,
    trust_remote_code: Annotated[Optional[bool], typer.Option(
        "--trust-remote-code", help="Run the tokenizer's own code (auto_map), as the servers' flag of that name "
                                    "(default: the run file's, else GENFLEET_TRUST_REMOTE_CODE)",
        show_default=False)] = None,
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
                        output_dir=output_dir, tokenizer=tokenizer, trust_remote_code=trust_remote_code,
                        reasoning_parser=reasoning_parser,
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
