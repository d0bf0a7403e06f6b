"""`genfleet worker` and `genfleet flower`: thin wrappers over `celery worker` and `celery flower`
with genfleet's settings, so every pool and Flower share one configuration."""
from __future__ import annotations

import logging
import os
from typing import Annotated, Any, Optional

import typer

from common.queues import PARTITIONS
from common.settings import Settings

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
    settings = settings_with(pool=pool, upstreams=upstream, concurrency=concurrency, api=api, tokenizer=tokenizer,
                             redis_url=redis_url, metrics_port=metrics_port)
    # One INFO line per HTTP request would drown the task log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from workers.lifecycle import run_worker  # Celery's worker machinery loads only here

    run_worker(settings, loglevel)


def flower_command(
    port: Annotated[int, typer.Option(help="Port of the Flower web UI")] = 5555,
    address: Annotated[str, typer.Option(help="Bind address (keep 127.0.0.1 without auth)")] = "127.0.0.1",
    max_tasks: Annotated[int, typer.Option(help="Tasks kept in memory for the task list")] = 20000,
    redis_url: Annotated[Optional[str], typer.Option(help="Default: GENFLEET_REDIS_URL")] = None,
) -> None:
    """Run Flower on the workers' own Celery app (same queues and visibility timeout)."""
    from workers.app import create_app

    settings = settings_with(redis_url=redis_url)
    argv = ["flower", f"--port={port}", f"--address={address}", f"--max_tasks={max_tasks}",
            "--purge_offline_workers=600",
            # Flower's default columns hide args, result and exception: the per-task id and size,
            # the summary with tok/s, and why a task failed are what an operator looks for.
            f"--tasks_columns={FLOWER_TASK_COLUMNS}",
            # Its runtime histogram stops at 10 s by default; our tasks run for minutes.
            "--task_runtime_metric_buckets=" + ",".join(str(b) for b in FLOWER_RUNTIME_BUCKETS)]
    if settings.flower_auth:
        argv.append(f"--basic-auth={settings.flower_auth}")
    else:
        # Flower refuses its API without auth; on loopback the API is fine for local use.
        if address not in ("127.0.0.1", "localhost", "::1"):
            raise typer.BadParameter("set GENFLEET_FLOWER_AUTH=user:password to bind Flower beyond loopback")
        # Flower reads this from the environment only (flower/views/__init__.py, 2.2.0): it is
        # Flower's own switch, not a genfleet setting.
        os.environ.setdefault("FLOWER_UNAUTHENTICATED_API", "true")
    create_app(settings).start(argv=argv)


def settings_with(**flags: Any) -> Settings:
    """The settings from GENFLEET_* env vars, with the flags the user gave (not None) on top."""
    return Settings(**{name: value for name, value in flags.items() if value is not None})
