"""`genfleet worker` and `genfleet flower`: thin wrappers over `celery worker` and `celery flower`
with genfleet's settings, so every pool and Flower share one configuration."""
from __future__ import annotations

import logging
import os
from typing import Annotated, Optional

import typer

from common.queues import LONG, PARTITIONS, SHORT

# In flight per SGLang host (DESIGN.md): long prompts hold far more KV cache each.
IN_FLIGHT_PER_HOST = {SHORT: 150, LONG: 32}

FLOWER_TASK_COLUMNS = "name,uuid,state,args,result,exception,received,runtime,worker"
FLOWER_RUNTIME_BUCKETS = (1, 5, 10, 30, 60, 120, 300, 600, 900, 1800, 2700, 3600)


def worker_command(
    pool: Annotated[str, typer.Option(help="Queue to consume: short or long")],
    upstream: Annotated[list[str], typer.Option(help="SGLang base URL; repeat for several hosts")],
    concurrency: Annotated[Optional[int], typer.Option(
        help="Requests in flight (default: 150 per host for short, 32 for long)")] = None,
    api: Annotated[Optional[str], typer.Option(
        help="generate (native /generate, default) or chat (/v1/chat/completions)")] = None,
    tokenizer: Annotated[Optional[str], typer.Option(
        help="Local model dir: split reasoning on token ids; needed by --regenerate all over /generate")] = None,
    redis_url: Annotated[Optional[str], typer.Option(help="Default: GENFLEET_REDIS_URL")] = None,
    metrics_port: Annotated[Optional[int], typer.Option(
        help="Prometheus /metrics port (default GENFLEET_METRICS_PORT, else 9650 short / 9651 long; 0: off)")] = None,
    loglevel: Annotated[str, typer.Option(help="Celery log level")] = "INFO",
) -> None:
    """Run a Celery worker (threads pool) that streams completions for one queue."""
    if pool not in PARTITIONS:
        raise typer.BadParameter(f"--pool must be one of {', '.join(PARTITIONS)}, not {pool!r}")
    if api is not None:
        os.environ["GENFLEET_API"] = api
    if metrics_port is not None:
        os.environ["GENFLEET_METRICS_PORT"] = str(metrics_port)
    if tokenizer is not None:
        os.environ["GENFLEET_TOKENIZER"] = tokenizer
    _apply_overrides(redis_url, upstreams=upstream)
    in_flight = concurrency or IN_FLIGHT_PER_HOST[pool] * len(upstream)

    # One INFO line per HTTP request would drown the task log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from workers import runtime
    runtime.configure(pool, in_flight)
    threads = in_flight + runtime.SPARE_THREADS
    from workers.app import app

    app.worker_main(argv=[
        "worker", "--pool=threads", f"--concurrency={threads}", f"--queues={pool}",
        f"--hostname={pool}-{os.getpid()}@%h", "--task-events", "--without-gossip", "--without-mingle",
        f"--loglevel={loglevel}",
    ])


def flower_command(
    port: Annotated[int, typer.Option(help="Port of the Flower web UI")] = 5555,
    address: Annotated[str, typer.Option(help="Bind address (keep 127.0.0.1 without auth)")] = "127.0.0.1",
    max_tasks: Annotated[int, typer.Option(help="Tasks kept in memory for the task list")] = 20000,
    redis_url: Annotated[Optional[str], typer.Option(help="Default: GENFLEET_REDIS_URL")] = None,
) -> None:
    """Run Flower on the workers' own Celery app (same queues and visibility timeout)."""
    _apply_overrides(redis_url)
    from common.settings import get_settings
    from workers.app import app

    argv = ["flower", f"--port={port}", f"--address={address}", f"--max_tasks={max_tasks}",
            "--purge_offline_workers=600",
            # Flower's default columns hide args, result and exception: the per-task id and size,
            # the summary with tok/s, and why a task failed are what an operator looks for.
            f"--tasks_columns={FLOWER_TASK_COLUMNS}",
            # Its runtime histogram stops at 10 s by default; our tasks run for minutes.
            "--task_runtime_metric_buckets=" + ",".join(str(b) for b in FLOWER_RUNTIME_BUCKETS)]
    auth = get_settings().flower_auth
    if auth:
        argv.append(f"--basic-auth={auth}")
    else:
        # Flower refuses its API without auth; on loopback the API is fine for local use.
        if address not in ("127.0.0.1", "localhost", "::1"):
            raise typer.BadParameter("set GENFLEET_FLOWER_AUTH=user:password to bind Flower beyond loopback")
        os.environ.setdefault("FLOWER_UNAUTHENTICATED_API", "true")
    app.start(argv=argv)


def _apply_overrides(redis_url: str | None, upstreams: list[str] | None = None) -> None:
    """CLI flags override env vars; set them before the app and settings are first built."""
    if redis_url:
        os.environ["GENFLEET_REDIS_URL"] = redis_url
    if upstreams:
        os.environ["GENFLEET_UPSTREAMS"] = ",".join(upstreams)
    from common.settings import get_settings
    get_settings.cache_clear()


def failures_command(
    run: Annotated[str, typer.Option(help="Run id")],
    redis_url: Annotated[Optional[str], typer.Option(help="Default: GENFLEET_REDIS_URL")] = None,
) -> None:
    """Dead letters of a run, grouped by error class and message."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from common.run_state import RunState, connect
    from common.settings import get_settings
    from workers.dead_letters import group_failures, read_dead_letters

    _apply_overrides(redis_url)
    letters = read_dead_letters(RunState(connect(get_settings().redis_url), run))
    table = Table(title=f"dead letters · run {run} · {len(letters)} prompts")
    for column in ("count", "class", "message", "example id"):
        table.add_column(column, justify="right" if column == "count" else "left")
    for group in group_failures(letters):
        table.add_row(str(group.count), group.error_class, escape(group.message), escape(group.example_id))
    Console().print(table)


def requeue_command(
    run: Annotated[str, typer.Option(help="Run id")],
    dataset: Annotated[Optional[str], typer.Option(help="Only this dataset")] = None,
    error_class: Annotated[Optional[str], typer.Option(help="Only this class: permanent, exhausted, integrity")] = None,
    match: Annotated[Optional[str], typer.Option(help="Only letters whose message contains this text")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(
        help="Override max_new_tokens (e.g. to fit the context)")] = None,
    dry_run: Annotated[bool, typer.Option(help="Show what would be requeued; change nothing")] = False,
    redis_url: Annotated[Optional[str], typer.Option(help="Default: GENFLEET_REDIS_URL")] = None,
) -> None:
    """Put dead letters back on their queue; each leaves the store only once re-published."""
    from rich.console import Console

    from common.run_state import RunState, connect
    from common.settings import get_settings
    from workers.dead_letters import read_dead_letters, requeue, select

    _apply_overrides(redis_url)
    state = RunState(connect(get_settings().redis_url), run)
    chosen = select(read_dead_letters(state), dataset=dataset, error_class=error_class, match=match)
    console = Console()
    if dry_run:
        for letter in chosen:
            console.print(f"would requeue {letter.id} ({letter.error_class}: {letter.message[:100]})", markup=False)
        console.print(f"{len(chosen)} dead letters would be requeued")
        return
    from rich.progress import track

    from workers.app import app

    # Each letter is published and dropped from the store one by one: thousands take a while.
    letters = track(chosen, description="requeueing", console=console, disable=not console.is_terminal,
                    transient=True)
    count = requeue(state, app, letters, max_new_tokens=max_new_tokens)
    console.print(f"requeued {count} dead letters of run {run}")
