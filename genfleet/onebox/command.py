"""`genfleet run`: a whole job on one box, in the foreground, from one command.

    genfleet run --run R --upstream URL [--upstream URL ...] --tokenizer DIR [--out DIR] NAME=PATH[:long] ...

It takes every `genfleet enqueue` option (or a run file) and the workers' `--upstream`,
`--in-flight` and `--api`, with a concurrency per pool. The enqueue options are not listed twice:
`run_command`'s signature is its own options plus `enqueue_command`'s, which typer reads
(`inspect.signature` honours `__signature__`; typer 0.29 `utils.get_params_from_function`), and
they reach the producer as the same flags (`enqueue_arguments`).
"""
from __future__ import annotations

import inspect
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from genfleet.common.records import Api, InFlight, choices
from genfleet.common.settings import Settings
from genfleet.onebox.embedded_redis import REDIS_MISSING, EmbeddedRedisError, Listen, redis_url_given
from genfleet.producer.command import enqueue_command
from genfleet.producer.readers import DatasetReadError, open_dataset
from genfleet.producer.run_config import DatasetSpec, RunFileError, load_run_file
from genfleet.workers.command import usage_error
from genfleet.workers.servers.transport import upstream_problem

# `genfleet enqueue` options that make no sense inside a job: it owns the Redis and the run.
ENQUEUE_OPTIONS_LEFT_OUT = ("redis_url", "dry_run", "recover_lost", "new_run")
# Shown first, before run's own options; the other enqueue options follow them.
ENQUEUE_OPTIONS_FIRST = ("datasets", "run", "tokenizer", "run_file")


def run_command(
    upstream: Annotated[list[str], typer.Option(help="SGLang base URL; repeat for several servers")],
    out: Annotated[Optional[Path], typer.Option(
        help="Output directory: shards, logs and the embedded Redis (default: GENFLEET_OUTPUT_DIR, else ./output)")]
    = None,
    short_concurrency: Annotated[Optional[int], typer.Option(
        min=1, help="Short pool's requests in flight (default: 150 per server)")] = None,
    long_concurrency: Annotated[Optional[int], typer.Option(
        min=1, help="Long pool's requests in flight (default: 32 per server)")] = None,
    in_flight: Annotated[Optional[str], typer.Option(
        "--in-flight", help="fixed or auto, as `genfleet worker --in-flight` (default: fixed)")] = None,
    api: Annotated[Optional[str], typer.Option(help="generate (default) or chat, as `genfleet worker --api`")] = None,
    listen: Annotated[Optional[str], typer.Option(
        help="ADDR:PORT: expose the embedded Redis (password required) so workers on other hosts join; prints "
             "their command line")] = None,
    flower: Annotated[bool, typer.Option("--flower", help="Start Flower beside the job (basic auth)")] = False,
    flower_port: Annotated[int, typer.Option(help="Flower's port, with --flower")] = 5555,
    serve: Annotated[Optional[int], typer.Option(
        min=1, max=65535, help="Serve the live status page on this port (loopback)")] = None,
    progress_every: Annotated[float, typer.Option(
        min=0.1, help="Without a terminal (nohup, a pipe, CI): seconds between progress lines")] = 30.0,
    export: Annotated[Optional[str], typer.Option(
        "--export", metavar="FORMAT", help="At the end, export the run in this format (see genfleet export)")] = None,
    export_to: Annotated[Optional[Path], typer.Option(help="--export's directory (new or empty)")] = None,
    **enqueue_options: Any,
) -> None:
    """The whole job on one box: Redis (embedded, unless GENFLEET_REDIS_URL names one), the short and long
    pools and the producer; progress until every prompt is settled, then a summary. Exit 0: nothing failed;
    1: prompts failed (the requeue command is printed); 2: a bad option. Ctrl-C stops; the same command
    resumes."""
    for url in upstream:
        if problem := upstream_problem(url):
            usage_error(f"--upstream {url!r}: {problem}")
    if in_flight is not None and in_flight not in choices(InFlight):
        usage_error(f"--in-flight must be one of {', '.join(choices(InFlight))}, not {in_flight!r}")
    if api is not None and api not in choices(Api):
        usage_error(f"--api must be one of {', '.join(choices(Api))}, not {api!r}")
    _check_export(export, export_to)
    for text in enqueue_options.get("datasets") or ():
        _check_dataset(text)
    try:
        parsed_listen = Listen.parse(listen) if listen else None
    except ValueError as error:
        usage_error(str(error))
    try:
        run_file = load_run_file(enqueue_options["run_file"]) if enqueue_options.get("run_file") else None
    except RunFileError as error:
        usage_error(str(error))
    run = enqueue_options.get("run") or (run_file.run if run_file else None)
    if not run:
        usage_error("--run (or `run` in the run file) names the job")
    # As the producer reads it: the run file's, else GENFLEET_REDIS_URL; else the job's own. The job
    # hands the one it uses to the producer and the workers alike.
    redis_url = (run_file.redis_url if run_file else None) or redis_url_given(None)
    if redis_url is None and shutil.which("redis-server") is None:
        usage_error(REDIS_MISSING)
    if parsed_listen is not None and redis_url is not None:
        usage_error("--listen exposes the embedded Redis; with GENFLEET_REDIS_URL (or the run file's redis_url) "
                    "other hosts use that Redis directly")
    # The job's machinery (status, the seam, rich's live view) loads only when a job runs: every
    # other genfleet command, and each of the job's own workers, imports this module.
    from genfleet.onebox.job import JobPlan, run_job

    plan = JobPlan(
        run=run, upstreams=tuple(upstream), out=out or Settings().output_dir,
        enqueue_args=tuple(enqueue_arguments(enqueue_options)), redis_url=redis_url,
        tokenizer=enqueue_options.get("tokenizer") or (run_file.tokenizer if run_file else None),
        trust_remote_code=bool(enqueue_options.get("trust_remote_code")
                               or (run_file is not None and run_file.trust_remote_code)),
        concurrency={"short": short_concurrency, "long": long_concurrency}, in_flight=in_flight, api=api,
        listen=parsed_listen, flower_port=flower_port if flower else None, serve_port=serve,
        progress_every_s=progress_every, export_format=export, export_to=export_to,
        context_length_given=enqueue_options.get("context_length") is not None
        or (run_file is not None and run_file.context_length is not None),
    )
    try:
        status = run_job(plan)
    except EmbeddedRedisError as error:
        print(f"error: {error}", flush=True)
        raise typer.Exit(1) from None
    raise typer.Exit(status)


def _check_export(export: str | None, export_to: Path | None) -> None:
    """`--export` is checked before the job runs, not after hours of it."""
    from genfleet.export.formats import FORMATS

    if (export is None) != (export_to is None):
        usage_error("--export FORMAT and --export-to DIR go together")
    if export is not None and export not in FORMATS:
        usage_error(f"--export must be one of {', '.join(FORMATS)}, not {export!r}")
    if export_to is not None and export_to.exists() and (not export_to.is_dir() or any(export_to.iterdir())):
        usage_error(f"--export-to {export_to}: must be a new or empty directory")


def _check_dataset(text: str) -> None:
    """A dataset argument that names nothing readable stops the job before anything starts."""
    try:
        open_dataset(str(DatasetSpec.parse(text).path))
    except (ValueError, DatasetReadError) as error:
        usage_error(str(error))


def _enqueue_parameters() -> list[inspect.Parameter]:
    parameters = inspect.signature(enqueue_command, eval_str=True).parameters
    return [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for name, p in parameters.items()
            if name not in ENQUEUE_OPTIONS_LEFT_OUT]


def _signature() -> inspect.Signature:
    own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
           for p in inspect.signature(run_command, eval_str=True).parameters.values()
           if p.kind is not inspect.Parameter.VAR_KEYWORD]
    enqueue = _enqueue_parameters()
    first = [p for p in enqueue if p.name in ENQUEUE_OPTIONS_FIRST]
    rest = [p for p in enqueue if p.name not in ENQUEUE_OPTIONS_FIRST]
    return inspect.Signature([*first, *own, *rest], return_annotation=None)


run_command.__signature__ = _signature()  # type: ignore[attr-defined]


def enqueue_arguments(values: Mapping[str, Any]) -> list[str]:
    """The `genfleet enqueue` command line that gives it these values: each option the user gave
    (a default is left for enqueue to apply), spelled as enqueue's own click parameters spell it."""
    app = typer.Typer()
    app.command()(enqueue_command)
    command = typer.main.get_command(app)
    positional: list[str] = []
    options: list[str] = []
    for param in command.params:
        value = values.get(param.name or "")
        if value is None or value == param.default or (param.multiple and not value):
            continue
        # Typer 0.29 carries its own copy of click (`typer._click`): its classes are not click's,
        # so the kind is read from the parameter, not from isinstance.
        if param.param_type_name == "argument":
            positional += [str(item) for item in value]
        elif getattr(param, "is_flag", False):
            if value:
                options.append(param.opts[0])
            elif param.secondary_opts:
                options.append(param.secondary_opts[0])
        elif param.multiple:
            for item in value:
                options += [param.opts[0], str(item)]
        else:
            options += [param.opts[0], str(value)]
    return [*options, *positional]
