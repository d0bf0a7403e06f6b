"""`genfleet worker` and `genfleet flower`: thin wrappers over `celery worker` and `celery flower`
with genfleet's settings, so every pool and Flower share one configuration.
"""
from __future__ import annotations

import logging
import sys
from typing import Annotated, NoReturn, Optional

import redis
import typer

from genfleet.common.queues import PARTITIONS
from genfleet.common.records import InFlight, choices
from genfleet.common.redis_checks import durability_problems
from genfleet.common.settings import SettingsError, flower_auth_problem, settings_with
from genfleet.workers.servers.transport import upstream_problem

FLOWER_TASK_COLUMNS = "name,uuid,state,args,result,exception,received,runtime,worker"
FLOWER_RUNTIME_BUCKETS = (1, 5, 10, 30, 60, 120, 300, 600, 900, 1800, 2700, 3600)


def worker_command(
    pool: Annotated[str, typer.Option(help="Queue to consume: short or long")],
    upstream: Annotated[list[str], typer.Option(help="SGLang base URL; repeat for several hosts")],
    concurrency: Annotated[Optional[int], typer.Option(
        help="Requests in flight (default: 150 per host for short, 32 for long)")] = None,
    in_flight: Annotated[Optional[str], typer.Option(
        "--in-flight", help="fixed: each host gets its share of --concurrency; auto: each host's streams follow "
                            "its own load (SGLang's /v1/loads), --concurrency the ceiling (default: fixed)")] = None,
    api: Annotated[Optional[str], typer.Option(
        help="generate (native /generate, default) or chat (/v1/chat/completions)")] = None,
    tokenizer: Annotated[Optional[str], typer.Option(
        help="Local model dir: split reasoning on token ids; needed by --regenerate all over /generate")] = None,
    trust_remote_code: Annotated[Optional[bool], typer.Option(
        "--trust-remote-code", help="Run the tokenizer's own code (auto_map), as the servers' flag of that name "
                                    "(default: GENFLEET_TRUST_REMOTE_CODE)", show_default=False)] = None,
    redis_url: Annotated[Optional[str], typer.Option(help="Default: GENFLEET_REDIS_URL")] = None,
    metrics_port: Annotated[Optional[int], typer.Option(
        help="Prometheus /metrics port (default GENFLEET_METRICS_PORT, else 9650 short / 9651 long; 0: off)")] = None,
    loglevel: Annotated[str, typer.Option(help="Celery log level")] = "INFO",
) -> None:
    """Run a Celery worker (threads pool) that streams completions for one queue."""
    if pool not in PARTITIONS:
        usage_error(f"--pool must be one of {', '.join(PARTITIONS)}, not {pool!r}")
    if concurrency is not None and concurrency < 1:
        usage_error(f"--concurrency must be at least 1, got {concurrency}")
    if in_flight is not None and in_flight not in choices(InFlight):
        usage_error(f"--in-flight must be one of {', '.join(choices(InFlight))}, not {in_flight!r}")
    try:
        settings = settings_with(pool=pool, upstreams=upstream, concurrency=concurrency, in_flight_mode=in_flight,
                                 api=api, tokenizer=tokenizer, trust_remote_code=trust_remote_code,
                                 redis_url=redis_url, metrics_port=metrics_port)
    except SettingsError as error:
        usage_error(str(error))
    for url in settings.upstreams:  # a bad URL fails here, not on every attempt
        if problem := upstream_problem(url):
            usage_error(f"--upstream {url!r}: {problem}")
    warn_about_redis(settings.redis_url)
    # One INFO line per HTTP request would drown the task log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from genfleet.workers.lifecycle import run_worker  # Celery's worker machinery loads only here

    run_worker(settings, loglevel)


def flower_command(
    port: Annotated[int, typer.Option(help="Port of the Flower web UI")] = 5555,
    address: Annotated[str, typer.Option(help="Bind address (0.0.0.0: every interface)")] = "127.0.0.1",
    max_tasks: Annotated[int, typer.Option(help="Tasks kept in memory for the task list")] = 20000,
    redis_url: Annotated[Optional[str], typer.Option(help="Default: GENFLEET_REDIS_URL")] = None,
) -> None:
    """Run Flower on the workers' own Celery app (same queues and visibility timeout), behind basic
    auth (GENFLEET_FLOWER_AUTH=user:password)."""
    settings = settings_with(redis_url=redis_url)
    # Flower 2.2.0 without auth either refuses its API or, with FLOWER_UNAUTHENTICATED_API, opens it
    # to every web page (CORS `*`, no XSRF check: flower/views/__init__.py); its cross-site checks
    # run only when auth is configured. So genfleet's Flower always has a password.
    if problem := flower_auth_problem(settings.flower_auth):
        usage_error(problem)
    from genfleet.workers.lifecycle import create_app

    argv = ["flower", f"--port={port}", f"--address={address}", f"--max_tasks={max_tasks}",
            "--purge_offline_workers=600", f"--basic-auth={settings.flower_auth}",
            # Flower's default columns hide args, result and exception: the per-task id and size,
            # the summary with tok/s, and why a task failed are what an operator looks for.
            f"--tasks_columns={FLOWER_TASK_COLUMNS}",
            # Its runtime histogram stops at 10 s by default; our tasks run for minutes.
            "--task_runtime_metric_buckets=" + ",".join(str(b) for b in FLOWER_RUNTIME_BUCKETS)]
    create_app(settings).start(argv=argv)


def warn_about_redis(url: str) -> None:
    """A warning per way the broker may lose prompts (no noeviction, no AOF: common/redis_checks.py).
    Logging is not set up yet (Celery does it), so the lines go to stderr as they are."""
    from genfleet.common.run_state import connect

    client = connect(url, timeout_s=5.0)
    try:
        problems = durability_problems(client)
    except redis.RedisError as error:
        problems = [f"could not check Redis's maxmemory-policy and AOF: {error or type(error).__name__}"]
    finally:
        client.close()
    for problem in problems:
        print(f"WARNING genfleet: {problem}", file=sys.stderr, flush=True)


def usage_error(message: str) -> NoReturn:
    """A one-line error on stderr and exit status 2, like a bad flag."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise typer.Exit(2)
