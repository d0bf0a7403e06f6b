"""`genfleet status`: a run at a glance, read from Redis and shown as a table (`--watch` refreshes it
every 2 s) or as one JSON object (`--json`). What is read is in `read_model`, how it is shown in
`render`, what is flagged in `alarms`.
"""
from __future__ import annotations

import json
import time
from typing import Annotated

import redis
import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from common.run_state import connect
from common.settings import Settings
from genfleet.status.alarms import NO_PROGRESS_S, AlarmSettings
from genfleet.status.read_model import read_status
from genfleet.status.render import render, status_json, wide_console

WATCH_INTERVAL_S = 2.0
# An operator's command: an unreachable Redis is reported in seconds, not after the workers' two
# minutes of retries.
REDIS_TIMEOUT_S = 5.0


def status_command(
    run: Annotated[str, typer.Option(help="Run id")],
    watch: Annotated[bool, typer.Option(help="Refresh every 2 s until interrupted")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
    no_progress_minutes: Annotated[float, typer.Option(
        help="Alarm when no prompt finishes for this long while some are pending")] = NO_PROGRESS_S / 60,
    redis_url: Annotated[str | None, typer.Option(help="Default: GENFLEET_REDIS_URL")] = None,
) -> None:
    """Per-dataset progress, rates, completion lengths, ETA and alarms of a run."""
    url = redis_url or Settings().redis_url
    try:
        _status(connect(url, timeout_s=REDIS_TIMEOUT_S), run, watch, as_json,
                AlarmSettings(no_progress_s=no_progress_minutes * 60))
    except redis.RedisError as error:
        Console(stderr=True).print(f"[red]error:[/] Redis at {escape(_without_password(url))}: "
                                   f"{escape(str(error) or type(error).__name__)}", soft_wrap=True)
        raise typer.Exit(1) from None


def _status(client: redis.Redis, run: str, watch: bool, as_json: bool, settings: AlarmSettings) -> None:
    if as_json:
        print(json.dumps(status_json(read_status(client, run), settings)))
        return
    console = wide_console()
    status = read_status(client, run)
    if not status.datasets:
        # Most often a typo in --run or another Redis: say so rather than show an empty, "finished" run.
        console.print(f"[yellow]run {escape(run)} has no datasets in this Redis[/] (never enqueued, another "
                      "--run, or another GENFLEET_REDIS_URL?)")
        if not watch:
            raise typer.Exit(1)
    if not watch:
        console.print(render(status, settings))
        return
    from rich.live import Live
    with Live(render(status, settings), console=console, refresh_per_second=1) as live:
        while True:
            time.sleep(WATCH_INTERVAL_S)
            try:
                live.update(render(read_status(client, run), settings))
            except redis.RedisError as error:  # a restart while watching: keep watching
                live.update(Text(f"Redis: {error or type(error).__name__} (retrying every "
                                 f"{WATCH_INTERVAL_S:.0f} s)", style="red"))


def _without_password(url: str) -> str:
    """The URL as it may be printed: any password replaced."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    return parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)).geturl()
