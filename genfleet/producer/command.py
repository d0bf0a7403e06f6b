"""`genfleet enqueue`: put datasets onto the short/long queues, each prompt once.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, NoReturn

import redis
import typer
from rich.console import Console
from rich.markup import escape

from genfleet.common.rebuild import recover
from genfleet.common.run_state import RunState, connect, created_at
from genfleet.common.settings import Settings, verify_tls_by_default
from genfleet.common.shards import find_shards
from genfleet.common.tokenizer import TokenizerNotFoundError
from genfleet.producer.enqueue import Destination, enqueue_dataset
from genfleet.producer.enqueue_report import (
    DatasetReport,
    DryRunDestination,
    EnqueueProgress,
    dry_run_table,
    print_rejections,
    queue_depth_table,
    rejections_table,
    results_table,
)
from genfleet.producer.manifest import (
    ConfigChanged,
    Manifest,
    RunIdentity,
    resolve_run,
    tokenizer_fingerprint,
)
from genfleet.producer.prompts import PromptTemplater
from genfleet.producer.publisher import TaskPublisher
from genfleet.producer.readers import DatasetReadError, open_dataset
from genfleet.producer.recovery import find_lost_rows, release_rows
from genfleet.producer.run_config import (
    CliOptions,
    ConfigError,
    DatasetSpec,
    RunConfig,
    RunFileError,
    flag_problems,
    load_run_file,
    parse_first_cap,
    resolve,
    run_name_problem,
)

console = Console(stderr=True)


def enqueue_command(
    datasets: Annotated[list[str] | None, typer.Argument(
        help="NAME=PATH (a file, a saved HF dataset directory or a glob), NAME=PATH:long to pin a partition",
        show_default=False)] = None,
    run: Annotated[str | None, typer.Option(help="Run id: all state and output of the run is keyed by it")] = None,
    tokenizer: Annotated[str | None, typer.Option(help="Local model/tokenizer directory with a chat template")] = None,
    trust_remote_code: Annotated[bool | None, typer.Option(
        "--trust-remote-code", help="Run the tokenizer's own code (auto_map in tokenizer_config.json, e.g. "
                                    "Kimi-K2's tokenization_kimi.py), as the servers' flag of that name "
                                    "(default: GENFLEET_TRUST_REMOTE_CODE, else off)", show_default=False)] = None,
    run_file: Annotated[Path | None, typer.Option(
        help="TOML file naming the datasets and their options; flags override it")] = None,
    long_threshold: Annotated[int | None, typer.Option(
        help="A prompt goes to 'long' when prompt tokens + short max_new_tokens exceed this")] = None,
    max_new_tokens_short: Annotated[int | None, typer.Option()] = None,
    max_new_tokens_long: Annotated[int | None, typer.Option()] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="max_new_tokens for every partition")] = None,
    context_length: Annotated[int | None, typer.Option(
        help="The model's context in tokens (default: the tokenizer's model_max_length)")] = None,
    context_rule: Annotated[str | None, typer.Option(
        help="reserve: reject prompt + max_new_tokens > context; clip: reject prompt >= context, "
             "lower max_new_tokens to what is left (default: reserve)")] = None,
    temperature: Annotated[float | None, typer.Option()] = None,
    top_p: Annotated[float | None, typer.Option()] = None,
    top_k: Annotated[int | None, typer.Option()] = None,
    min_p: Annotated[float | None, typer.Option()] = None,
    seed: Annotated[int | None, typer.Option(help="sampling_seed sent to SGLang")] = None,
    sampling: Annotated[list[str] | None, typer.Option(
        help="Any SGLang sampling parameter, KEY=VALUE (VALUE as JSON); repeatable")] = None,
    thinking: Annotated[bool | None, typer.Option(
        "--thinking/--no-thinking", help="chat_template_kwargs thinking / enable_thinking")] = None,
    chat_template_kwarg: Annotated[list[str] | None, typer.Option(
        help="A chat template kwarg, KEY=VALUE (VALUE as JSON); repeatable")] = None,
    regenerate: Annotated[str | None, typer.Option(
        help="last: reply to the last user turn; all: regenerate every assistant turn in order "
             "(default: last)")] = None,
    keep_token_ids: Annotated[bool | None, typer.Option(
        "--keep-token-ids/--no-keep-token-ids",
        help="Store the generated token ids in each record (token-exact training data)")] = None,
    format: Annotated[str | None, typer.Option(
        "--format", help="Row format: auto, messages, sharegpt, prompt, openai_batch (default: auto)")] = None,
    prompt_field: Annotated[str | None, typer.Option(
        help="The field holding the prompt string for --format prompt (default: prompt)")] = None,
    max_prompts: Annotated[int | None, typer.Option(help="Enqueue at most this many prompts per dataset")] = None,
    max_tokens_per_dataset: Annotated[int | None, typer.Option(
        help="Completion-token budget per dataset, enforced by the workers")] = None,
    max_queue_depth: Annotated[int | None, typer.Option(
        help="Keep each queue at most this deep, waiting for workers to drain it (default 15,000 short, "
             "3,200 long; 0: no limit)")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Rows per batch; each batch is published atomically")] = None,
    loop_guard: Annotated[str | None, typer.Option(
        help="A completion that repeats itself degenerately: abort (stop it at once, free the server's slot, "
             "keep the partial text with finish_reason 'loop'), flag (let it run, mark it), off "
             "(default: abort)")] = None,
    on_truncated: Annotated[str | None, typer.Option(
        help="A completion cut at max_new_tokens: keep it, continue it on the long queue from where it stopped "
             "(recommended; /generate only), or regenerate it with the larger budget (default: keep)")] = None,
    max_new_tokens_total: Annotated[int | None, typer.Option(
        help="The most completion tokens over all parts of a continued or regenerated completion "
             "(default: the long partition's max_new_tokens)")] = None,
    first_max_new_tokens: Annotated[str | None, typer.Option(
        help="The max_new_tokens of each prompt's first request: N tokens, or auto (a high quantile of the "
             "dataset's finished lengths). A completion cut there goes on exactly up to its real cap, so "
             "records are unchanged, while the server reserves less KV cache per request and admits more "
             "(/generate only; default: the full cap)")] = None,
    samples: Annotated[int | None, typer.Option(
        help="Completions per prompt (ids ID#0..ID#N-1), each with its own sampling_seed derived from the "
             "prompt id (default: 1)")] = None,
    new_run: Annotated[bool, typer.Option(
        "--new-run", help="If the run exists with another config, enqueue into a fresh run "
                          "RUN-cfg<hash> instead of refusing")] = False,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Read, template and count everything; publish nothing (no Redis needed)")] = False,
    recover_lost: Annotated[bool, typer.Option(
        "--recover-lost", help="Re-publish prompts a killed worker lost in transit (enqueued, not done, "
                               "in no queue); run it when the fleet is drained")] = False,
    redis_url: Annotated[str | None, typer.Option(help="Default: GENFLEET_REDIS_URL")] = None,
) -> None:
    """Template, count and enqueue each prompt of the datasets once (re-runs add only what is new)."""
    pairs = _pairs(sampling, "--sampling")
    flags = _given(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, sampling_seed=seed)
    _refuse(flag_problems({
        "--long-threshold": long_threshold, "--max-new-tokens-short": max_new_tokens_short,
        "--max-new-tokens-long": max_new_tokens_long, "--max-new-tokens": max_new_tokens,
        "--context-length": context_length, "--max-prompts": max_prompts,
        "--max-tokens-per-dataset": max_tokens_per_dataset, "--max-queue-depth": max_queue_depth,
        "--batch-size": batch_size, "--max-new-tokens-total": max_new_tokens_total,
        "--samples": samples}, pairs, flags))
    cli = CliOptions(
        datasets=tuple(_parse_spec(text) for text in datasets or ()), run=run, tokenizer=tokenizer,
        trust_remote_code=trust_remote_code or None,
        redis_url=verify_tls_by_default(redis_url) if redis_url else None, long_threshold=long_threshold,
        max_new_tokens_short=max_new_tokens_short,
        max_new_tokens_long=max_new_tokens_long, max_new_tokens=max_new_tokens, context_length=context_length,
        context_rule=context_rule,
        sampling={**pairs, **flags},
        chat_template_kwargs=_pairs(chat_template_kwarg, "--chat-template-kwarg"), thinking=thinking,
        regenerate=regenerate, keep_token_ids=keep_token_ids, row_format=format, prompt_field=prompt_field,
        max_prompts=max_prompts, max_tokens_per_dataset=max_tokens_per_dataset, max_queue_depth=max_queue_depth,
        batch_size=batch_size, loop_guard=loop_guard, on_truncated=on_truncated,
        max_new_tokens_total=max_new_tokens_total, samples=samples,
    )
    try:
        cli = replace(cli, first_max_new_tokens=parse_first_cap(first_max_new_tokens))
        settings = Settings()
        config = resolve(cli, load_run_file(run_file) if run_file else None, settings)
        if settings.api == "chat" and any(d.on_truncated == "continue" for d in config.datasets):
            # The chat API returns text, not the token ids a continuation's prompt is built from.
            console.print("note: GENFLEET_API=chat: workers regenerate truncated completions with the larger "
                          "budget instead of continuing them (continue needs /generate's token ids)",
                          soft_wrap=True)
        if settings.api == "chat" and any(d.first_max_new_tokens is not None for d in config.datasets):
            console.print("note: GENFLEET_API=chat: workers ask the full cap at once (--first-max-new-tokens needs "
                          "/generate's token ids to continue exactly)", soft_wrap=True)
        for dataset in config.datasets:
            open_dataset(dataset.source)  # a missing file fails now, not after an hour of the others
        with PromptTemplater(config.tokenizer, trust_remote_code=config.trust_remote_code,
                             processes=os.cpu_count() or 1) as templater:
            if dry_run:
                _dry_run(config, templater)
            else:
                _enqueue(config, templater, new_run=new_run, recover_lost=recover_lost)
    except (ConfigError, RunFileError, DatasetReadError, ConfigChanged, TokenizerNotFoundError) as error:
        _refuse([str(error)])
    except redis.RedisError as error:
        # Every batch published so far is complete and marked: running the command again resumes.
        console.print(f"[red]error:[/] Redis: {escape(str(error))} (every batch published so far is complete: "
                      "run the command again to resume)", soft_wrap=True)
        raise typer.Exit(1) from None


def _enqueue(config: RunConfig, templater: PromptTemplater, *, new_run: bool, recover_lost: bool) -> None:
    client = connect(config.redis_url)
    identity = RunIdentity.of(config, tokenizer_fingerprint(config.tokenizer))
    run = resolve_run(client, config, identity, new_run=new_run)
    if run != config.run and (problem := run_name_problem(run)):
        raise ConfigError(f"--new-run: {problem}; pick a shorter --run")
    if recover_lost:
        lost = find_lost_rows(client, run, [dataset.name for dataset in config.datasets])
        for name, rows in lost.items():
            console.print(f"recovering {len(rows)} lost prompts of {escape(name)}")
            release_rows(client, run, name, rows)
        if not lost:
            console.print("no lost prompts")
    if run != config.run:
        console.print(f"[bold]run {escape(config.run)} has another config: enqueueing into new run "
                      f"[cyan]{escape(run)}[/][/] (use --run {escape(run)} for status and export)")
        Manifest(client, config.run).mark_superseded(run)
    _recover_from_disk(client, run, config)
    Manifest(client, run).record(config, identity, predecessor=config.run if run != config.run else None)
    reports: list[DatasetReport] = []
    started = time.monotonic()
    with EnqueueProgress(console) as progress:
        publisher = TaskPublisher(config.redis_url, client, run, max_queue_depth=config.max_queue_depth,
                                  on_wait=progress.waiting)
        try:
            for dataset in config.datasets:
                reports.append(_one_dataset(config, run, dataset, templater, publisher, progress))
        finally:
            publisher.close()
    Console().print(results_table(run, reports, time.monotonic() - started))
    for problem in nothing_accepted(reports):
        console.print(f"[yellow]warning:[/] {escape(problem)}", soft_wrap=True)
    if reports and not any(_accepted(report) for report in reports):
        # Exit 0 here once let a job "finish" with nothing done; the warnings above say why and the fix.
        console.print("[red]error:[/] no prompt was enqueued or is in the run", soft_wrap=True)
        raise typer.Exit(1)


def _accepted(report: DatasetReport) -> int:
    return report.total_enqueued + report.already_queued + report.already_done


def nothing_accepted(reports: list[DatasetReport]) -> list[str]:
    """A line per dataset whose every row was rejected, naming the fix when the context was why."""
    lines = []
    for report in reports:
        if _accepted(report) or not report.rejected:
            continue
        line = f"{report.dataset}: every row was rejected ({report.rejected:,})"
        too_long = report.rejected_by_kind["prompt too long"]
        if too_long:
            line += (f"; {too_long:,} too long for the context: lower --max-new-tokens-short / --max-new-tokens-long "
                     "(or --max-new-tokens), or pass --context-rule clip to give each prompt what is left of it")
        else:
            line += "; the reasons are above"
        lines.append(line)
    return lines


def _recover_from_disk(client: redis.Redis, run: str, config: RunConfig) -> None:
    """A run this Redis has never seen (or has lost: no manifest) whose records lie on this host's
    disk: their rows are settled from them first (genfleet/recover.py), so only the rest is
    published. Other hosts' shards need `genfleet recover` there."""
    if config.output_dir is None or created_at(client, [run])[0] is not None:
        return
    shards = find_shards([config.output_dir], run)
    if not shards:
        return
    console.print(f"run {escape(run)} is not in this Redis, but {len(shards)} of its shards are under "
                  f"{escape(str(config.output_dir))}: settling their rows first (genfleet recover)")
    found = recover(RunState(client, run), [config.output_dir], reasoning_parser=config.reasoning_parser)
    console.print(f"{sum(found.settled.values()):,} rows settled from {sum(found.records.values()):,} records; "
                  "records on other hosts: run `genfleet recover` there")


def _dry_run(config: RunConfig, templater: PromptTemplater) -> None:
    reports: list[DatasetReport] = []
    destination = DryRunDestination()
    with EnqueueProgress(console) as progress:
        for dataset in config.datasets:
            reports.append(_one_dataset(config, config.run, dataset, templater, destination, progress))
    out = Console()
    out.print(dry_run_table(reports))
    out.print(queue_depth_table(reports, config.max_queue_depth))
    rejected = rejections_table(reports)
    if rejected is not None:
        out.print(rejected)
    for problem in nothing_accepted(reports):
        console.print(f"[yellow]warning:[/] {escape(problem)}", soft_wrap=True)


def _one_dataset(config: RunConfig, run: str, dataset: Any, templater: PromptTemplater,
                 destination: Destination, progress: EnqueueProgress) -> DatasetReport:
    on_rows = progress.dataset(dataset.name, open_dataset(dataset.source).known_rows())
    report = enqueue_dataset(dataset, config, run, templater=templater, destination=destination,
                             context_length=config.context_length or templater.context_length, on_rows=on_rows)
    print_rejections(console, report)
    return report


def _refuse(problems: list[str]) -> None:
    """Each problem on one line of stderr, then exit 2 (a usage error) before anything is enqueued."""
    for problem in problems[:-1]:
        console.print(f"[red]error:[/] {escape(problem)}", soft_wrap=True)
    if problems:
        _fail(problems[-1])


def _fail(problem: str) -> NoReturn:
    console.print(f"[red]error:[/] {escape(problem)}", soft_wrap=True)
    raise typer.Exit(2)


def _parse_spec(text: str) -> DatasetSpec:
    try:
        return DatasetSpec.parse(text)
    except ValueError as error:
        _fail(str(error))


def _pairs(items: list[str] | None, flag: str) -> dict[str, Any]:
    """KEY=VALUE flags; VALUE is read as JSON when it is JSON (numbers, true/false), else as text."""
    pairs: dict[str, Any] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            _fail(f"{flag} expects KEY=VALUE, got {item!r}")
        try:
            pairs[key] = json.loads(value)
        except ValueError:
            pairs[key] = value
    return pairs


def _given(**values: Any) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}
