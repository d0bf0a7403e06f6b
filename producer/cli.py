"""`genfleet enqueue`: put datasets onto the short/long queues, once."""
from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from common.run_state import RunState, connect
from common.settings import get_settings
from producer.enqueue import DatasetSpec, EnqueueOptions, enqueue_dataset
from producer.publisher import TaskPublisher
from producer.templating import PromptTemplater

console = Console(stderr=True)
MAX_REJECTIONS_SHOWN = 20


def enqueue_command(
    datasets: Annotated[list[str], typer.Argument(help="NAME=PATH, or NAME=PATH:long to pin a partition")],
    run: Annotated[str, typer.Option(help="Run id: all state and output of the run is keyed by it")],
    tokenizer: Annotated[str, typer.Option(help="Local model/tokenizer directory with a chat template")],
    long_threshold: Annotated[Optional[int], typer.Option(
        help="A prompt goes to 'long' when prompt tokens + short max_new_tokens exceed this")] = None,
    max_new_tokens_short: Annotated[Optional[int], typer.Option()] = None,
    max_new_tokens_long: Annotated[Optional[int], typer.Option()] = None,
    context_length: Annotated[Optional[int], typer.Option(
        help="Reject prompts whose tokens + max_new_tokens exceed this (default: the tokenizer's)")] = None,
    temperature: Annotated[Optional[float], typer.Option()] = None,
    top_p: Annotated[Optional[float], typer.Option()] = None,
    seed: Annotated[Optional[int], typer.Option(help="sampling_seed sent to SGLang")] = None,
    thinking: Annotated[Optional[bool], typer.Option(
        "--thinking/--no-thinking", help="chat_template_kwargs thinking / enable_thinking")] = None,
    regenerate: Annotated[str, typer.Option(
        help="last: reply to the last user turn; all: regenerate every assistant turn in order")] = "last",
    keep_token_ids: Annotated[bool, typer.Option(
        help="Store the generated token ids in each record (token-exact training data)")] = False,
    redis_url: Annotated[Optional[str], typer.Option(help="Default: GENFLEET_REDIS_URL")] = None,
) -> None:
    """Template, count and enqueue each prompt of the datasets once (re-runs add only what is new)."""
    settings = get_settings()
    if regenerate not in ("last", "all"):
        raise typer.BadParameter(f"--regenerate must be 'last' or 'all', not {regenerate!r}")
    specs = [_parse_spec(text) for text in datasets]
    template_kwargs = {} if thinking is None else {"thinking": thinking, "enable_thinking": thinking}
    templater = PromptTemplater(tokenizer, template_kwargs)
    model_max = getattr(templater.tokenizer, "model_max_length", None)
    options = EnqueueOptions(
        run=run,
        max_new_tokens={"short": max_new_tokens_short or settings.max_new_tokens_short,
                        "long": max_new_tokens_long or settings.max_new_tokens_long},
        long_threshold=long_threshold or settings.long_threshold_tokens,
        context_length=context_length or (model_max if model_max and model_max < 10**8 else None),
        sampling=_sampling(temperature, top_p, seed),
        chat_template_kwargs=template_kwargs,
        keep_token_ids=keep_token_ids,
        regenerate=regenerate,
    )
    url = redis_url or settings.redis_url
    state = RunState(connect(url), run)
    publisher = TaskPublisher(url)
    table = Table(title=f"enqueue · run {run}")
    for column in ("dataset", "short", "long", "already queued", "rejected"):
        table.add_column(column, justify="left" if column == "dataset" else "right")
    try:
        for spec in specs:
            with console.status(f"enqueueing {spec.name} from {spec.path}"):
                report = enqueue_dataset(spec, templater=templater, state=state,
                                         publisher=publisher, options=options)
            for rejection in report.rejected[:MAX_REJECTIONS_SHOWN]:
                console.print(f"[yellow]rejected[/] {escape(rejection.file)}:{rejection.line}: "
                              f"{escape(rejection.reason)}", soft_wrap=True)
            if len(report.rejected) > MAX_REJECTIONS_SHOWN:
                console.print(f"[yellow]… {len(report.rejected) - MAX_REJECTIONS_SHOWN} more rejections "
                              f"in {spec.name}[/]")
            table.add_row(spec.name, str(report.enqueued["short"]), str(report.enqueued["long"]),
                          str(report.already_queued), str(len(report.rejected)))
    finally:
        publisher.close()
    Console().print(table)


def _parse_spec(text: str) -> DatasetSpec:
    try:
        return DatasetSpec.parse(text)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None


def _sampling(temperature: float | None, top_p: float | None, seed: int | None) -> dict:
    given = {"temperature": temperature, "top_p": top_p, "sampling_seed": seed}
    return {key: value for key, value in given.items() if value is not None}
