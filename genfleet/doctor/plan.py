"""What the run will use, resolved as its own commands resolve it: a flag over the run file over the
`GENFLEET_*` settings over the defaults. The run file goes through the producer's `resolve`, so the
doctor checks the queue depths, context length and chat template kwargs that `genfleet enqueue`
would use, not a second reading of the same file."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from genfleet import ToolError
from genfleet.common.queues import LONG, SHORT
from genfleet.common.settings import Settings, SettingsError, settings_with
from genfleet.producer.run_config import CliOptions, ConfigError, DatasetSpec, RunFile, load_run_file, resolve
from genfleet.workers.servers.transport import upstream_problem

_NO_DATASET = DatasetSpec("doctor", Path("-"))


class PreflightError(ToolError, ValueError):
    """A flag, the run file or a setting is unusable; the message names which."""


@dataclass(frozen=True)
class DoctorFlags:
    """What the command line said; None (or empty) where it said nothing."""
    upstreams: tuple[str, ...] = ()
    run_file: Path | None = None
    redis_url: str | None = None
    output_dir: Path | None = None
    tokenizer: str | None = None
    trust_remote_code: bool | None = None
    reasoning_parser: str | None = None
    max_queue_depth: int | None = None
    prompt_tokens: int = 2048


@dataclass(frozen=True)
class TemplateVariant:
    """One set of chat template kwargs the datasets are rendered with, and the datasets using it."""
    kwargs: dict[str, Any]
    datasets: tuple[str, ...]


@dataclass(frozen=True)
class Preflight:
    settings: Settings
    # Per queue; 0: unlimited (the producer's `--max-queue-depth`).
    queue_depth: dict[str, int]
    # The prompt length, in tokens, that Redis memory is planned for, per queue.
    planned_prompt_tokens: dict[str, int]
    variants: tuple[TemplateVariant, ...]
    # The run's `context_length` (flag or run file); None: the tokenizer's.
    context_length: int | None
    # The run file's datasets: name -> path or glob.
    datasets: dict[str, str]


def resolve_preflight(flags: DoctorFlags) -> Preflight:
    """Raises PreflightError (or the run file's RunFileError) naming the bad flag, file or setting."""
    run_file = load_run_file(flags.run_file) if flags.run_file else None
    top = run_file or RunFile()
    try:
        settings = settings_with(
            upstreams=list(flags.upstreams) or None, redis_url=flags.redis_url or top.redis_url,
            output_dir=flags.output_dir, reasoning_parser=flags.reasoning_parser,
            tokenizer=flags.tokenizer or top.tokenizer,
            trust_remote_code=flags.trust_remote_code or top.trust_remote_code)
    except SettingsError as error:
        raise PreflightError(str(error)) from None
    _validate(settings, flags)
    cli = CliOptions(run=top.run or "doctor", tokenizer=str(settings.tokenizer or "-"),
                     max_queue_depth=flags.max_queue_depth, datasets=() if top.datasets else (_NO_DATASET,))
    try:
        config = resolve(cli, run_file, settings)
    except ConfigError as error:
        raise PreflightError(f"{flags.run_file or 'settings'}: {error}") from None
    variants: dict[str, TemplateVariant] = {}
    for dataset in config.datasets:
        key = repr(sorted(dataset.chat_template_kwargs.items()))
        known = variants.get(key, TemplateVariant(dict(dataset.chat_template_kwargs), ()))
        names = known.datasets + ((dataset.name,) if dataset.name in top.datasets else ())
        variants[key] = TemplateVariant(known.kwargs, names)
    # A prompt goes to `long` when its tokens plus the short max_new_tokens exceed the threshold, so
    # an unpinned long prompt is at least this long.
    shortest_long = config.long_threshold - max(d.max_new_tokens[SHORT] for d in config.datasets)
    return Preflight(
        settings=settings, queue_depth=config.max_queue_depth,
        planned_prompt_tokens={SHORT: flags.prompt_tokens, LONG: max(flags.prompt_tokens, shortest_long)},
        variants=tuple(variants.values()), context_length=config.context_length,
        datasets={d.name: d.source for d in config.datasets if d.name in top.datasets},
    )


def _validate(settings: Settings, flags: DoctorFlags) -> None:
    for url in settings.upstreams:
        if problem := upstream_problem(url):
            raise PreflightError(f"--upstream {url!r}: {problem}")
    if flags.prompt_tokens < 1:
        raise PreflightError(f"--prompt-tokens must be at least 1, got {flags.prompt_tokens}")
    if flags.max_queue_depth is not None and flags.max_queue_depth < 0:
        raise PreflightError(f"--max-queue-depth must be at least 0, got {flags.max_queue_depth}")


# An operator's command: a Redis or host that does not answer is reported in seconds.
