"""`genfleet status`: a run at a glance, read from Redis and shown as a table fitted to the terminal
(`--wide`: every column; `--watch` redraws it in place every 2 s until Ctrl-C) or as one JSON object
(`--json`). What is read is in `read_model`, how it is shown in `render` (and fitted in `terminal`),
what is flagged in `alarms`.
"""
from __future__ import annotations

import json
import sys
import time
from typing import Annotated

import redis
import typer
from rich.console import Console, RenderableType
from rich.markup import escape
from rich.text import Text

from genfleet.common.run_state import connect
from genfleet.common.settings import Settings, flower_auth_problem, printable_url
from genfleet.onebox.embedded_redis import reach_redis, redis_url_given
from genfleet.status.alarms import NO_PROGRESS_S, AlarmSettings, alarms
from genfleet.status.read_model import read_status
from genfleet.status.render import keys_not_echoed, render, status_console, status_json
from genfleet.workers.command import usage_error

WATCH_INTERVAL_S = 2.0
# An operator's command: an unreachable Redis is reported in seconds, not after the workers' two
# minutes of retries.
REDIS_TIMEOUT_S = 5.0


def status_command(
    run: Annotated[str, typer.Option(help="Run id")],
    watch: Annotated[bool, typer.Option(help="Redraw in place every 2 s until Ctrl-C")] = False,
    wide: Annotated[bool, typer.Option(
        help="Every column, exact counts (about 215 columns); by default the table fits the terminal")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
    no_progress_minutes: Annotated[float, typer.Option(
        help="Alarm when no prompt finishes for this long while some are pending")] = NO_PROGRESS_S / 60,
    redis_url: Annotated[str | None, typer.Option(help="Default: GENFLEET_REDIS_URL")] = None,
    serve: Annotated[int | None, typer.Option(
        min=1, max=65535, help="Serve a live page of the run on this port (genfleet/status/page.py)")] = None,
    bind: Annotated[str, typer.Option(
        help="Address for --serve; beyond loopback only with GENFLEET_FLOWER_AUTH=user:password")] = "127.0.0.1",
    flower_url: Annotated[str, typer.Option(help="Flower, for --serve's links to failed tasks")] = "http://127.0.0.1:5555",
) -> None:
    """Per-dataset progress, rates, completion lengths, ETA and alarms of a run."""
    with reach_redis(redis_url) as url:
        if serve is not None:
            serve_page(url, run, port=serve, bind=bind, flower_url=flower_url, auth=Settings().flower_auth,
                       settings=AlarmSettings(no_progress_s=no_progress_minutes * 60),
                       redis_timeout_s=REDIS_TIMEOUT_S)
            return
        _status_or_error(url, run, watch, as_json, AlarmSettings(no_progress_s=no_progress_minutes * 60), wide)


def _status_or_error(url: str, run: str, watch: bool, as_json: bool, settings: AlarmSettings, wide: bool) -> None:
    try:
        _status(connect(url, timeout_s=REDIS_TIMEOUT_S), run, watch, as_json, settings, wide=wide)
    except redis.RedisError as error:
        # The default URL, nobody named one: perhaps a `genfleet run` job's Redis was meant.
        hint = ("; for a `genfleet run` job, run this where its output directory is, or set GENFLEET_OUTPUT_DIR"
                if redis_url_given(None) is None else "")
        Console(stderr=True).print(f"[red]error:[/] Redis at {escape(printable_url(url))}: "
                                   f"{escape(str(error) or type(error).__name__)}{hint}", soft_wrap=True)
        raise typer.Exit(1) from None


def _status(client: redis.Redis, run: str, watch: bool, as_json: bool, settings: AlarmSettings, *,
            wide: bool = False) -> None:
    if as_json:
        print(json.dumps(status_json(read_status(client, run), settings)))
        return
    console = status_console(wide)
    status = read_status(client, run)
    if not status.datasets and status.lost_by:
        for line in alarms(status, settings):
            console.print(f"[red]alarm:[/] {escape(line)}", soft_wrap=True)
        if not watch:
            raise typer.Exit(1)
    elif not status.datasets:
        # Most often a typo in --run or another Redis: say so rather than show an empty, "finished" run.
        console.print(f"[yellow]run {escape(run)} has no datasets in this Redis[/] (never enqueued, another "
                      "--run, or another GENFLEET_REDIS_URL?)")
        if not watch:
            raise typer.Exit(1)
    if not watch:
        console.print(render(status, settings, wide=wide))
        return
    _watch(client, run, console, render(status, settings, wide=wide), settings, wide)


def _watch(client: redis.Redis, run: str, console: Console, first: RenderableType, settings: AlarmSettings,
           wide: bool) -> None:
    """Redraws in place: rich's `Live` moves the cursor back up over what it drew (screen=False, so
    the last table stays on the screen after Ctrl-C); a table taller than the terminal is cut to
    its height with "..." (vertical_overflow="ellipsis") rather than scrolled, which would leave a
    copy of it in the scrollback at each refresh (rich/live.py, rich/live_render.py, rich 15.0.0).
    It refreshes each second, and each refresh lays the tables out for the terminal's width then;
    keys typed meanwhile are not echoed, as an echoed Enter would move the cursor under it."""
    from rich.live import Live

    with keys_not_echoed(), Live(first, console=console, refresh_per_second=1, screen=False,
                                 vertical_overflow="ellipsis") as live:
        try:
            while True:
                time.sleep(WATCH_INTERVAL_S)
                try:
                    live.update(render(read_status(client, run), settings, wide=wide))
                except redis.RedisError as error:  # a restart while watching: keep watching
                    live.update(Text(f"Redis: {error or type(error).__name__} (retrying every "
                                     f"{WATCH_INTERVAL_S:.0f} s)", style="red"))
        except KeyboardInterrupt:  # how a watch ends: leave the last table, exit 0, no traceback
            pass


def serve_page(redis_url: str, run: str, *, port: int, bind: str, flower_url: str, auth: str | None,
               settings: AlarmSettings, redis_timeout_s: float) -> None:
    """The `--serve` branch of `genfleet status`: checks the flags and the auth rule, listens, serves."""
    # Starlette and uvicorn load only when serving.
    from genfleet.status.page import LOOPBACK_NAMES, create_app, flower_url_problem, is_loopback, listen, serve

    if problem := flower_url_problem(flower_url):
        usage_error(f"--flower-url {problem}")
    loopback = is_loopback(bind)
    if not loopback and not auth:
        usage_error(f"--bind {bind} is not a loopback address: the status page is served beyond this machine only "
                    "behind basic auth, as Flower is: set GENFLEET_FLOWER_AUTH=user:password, or keep --bind 127.0.0.1")
    if auth and (problem := flower_auth_problem(auth)):
        usage_error(problem)
    try:
        sock = listen(bind, port)
    except OSError as error:
        print(f"error: --serve {port} --bind {bind}: cannot listen there: {error.strerror or error}", file=sys.stderr)
        raise typer.Exit(1) from None
    bare = bind.strip("[]")
    where = f"[{bare}]" if ":" in bare else bare  # as a URL and a Host header name it
    hosts = None if auth else sorted({*LOOPBACK_NAMES, where})
    app = create_app(connect(redis_url, timeout_s=redis_timeout_s), run, flower_url=flower_url.rstrip("/"),
                     settings=settings, auth=auth, hosts=hosts)
    print(f"genfleet status: run {run} on http://{where}:{port}/ (JSON: /api/status.json"
          f"{', basic auth from GENFLEET_FLOWER_AUTH' if auth else ''}); Ctrl-C stops", flush=True)
    serve(app, sock)
