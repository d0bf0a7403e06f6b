"""`genfleet status`: per-dataset progress of a run, read from Redis counters and queue depths."""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Annotated, Optional

import redis
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from common.queues import PARTITIONS
from common.run_state import RunState, connect
from common.settings import get_settings


@dataclass(frozen=True)
class DatasetProgress:
    dataset: str
    total: int
    done: int
    failed: int
    rejected: int
    skipped: int
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    truncated: int
    empty_reasoning: int
    empty_content: int
    aborted: int

    @property
    def pending(self) -> int:
        return max(self.total - self.done - self.failed - self.skipped, 0)

    @property
    def finished(self) -> bool:
        return self.pending == 0


@dataclass(frozen=True)
class RunProgress:
    run: str
    datasets: list[DatasetProgress]
    queued: dict[str, int]  # messages waiting per queue (all runs share the queues)
    unacked: int  # messages delivered to workers, not yet acknowledged

    @property
    def finished(self) -> bool:
        return all(d.finished for d in self.datasets)

    def totals(self) -> DatasetProgress:
        fields = {name: sum(getattr(d, name) for d in self.datasets)
                  for name in DatasetProgress.__dataclass_fields__ if name != "dataset"}
        return DatasetProgress(dataset="all", **fields)


# Alarm thresholds, as shares of a dataset's completions, once it has a few.
EMPTY_REASONING_ALARM = 0.05
TRUNCATION_ALARM = 0.10
ALARM_MIN_SAMPLES = 5


def alarms(progress: RunProgress) -> list[str]:
    """One line per data-quality problem an operator must look at now."""
    lines = []
    for d in progress.datasets:
        if d.done < ALARM_MIN_SAMPLES:
            continue
        if d.empty_reasoning / d.done > EMPTY_REASONING_ALARM:
            lines.append(f"{d.dataset}: {100 * d.empty_reasoning / d.done:.0f}% of completions have empty "
                         "reasoning on a reasoning model: check GENFLEET_REASONING_PARSER and that the "
                         "template's <think> is not lost (skip_special_tokens)")
        if d.truncated / d.done > TRUNCATION_ALARM:
            lines.append(f"{d.dataset}: {100 * d.truncated / d.done:.0f}% of completions stopped at "
                         "max_new_tokens (finish_reason length): raise the cap or expect cut-off answers")
    return lines


def read_progress(client: redis.Redis, run: str) -> RunProgress:
    state = RunState(client, run)
    datasets = [DatasetProgress(dataset=name, **state.counters(name)) for name in state.datasets()]
    pipe = client.pipeline(transaction=False)
    for queue in PARTITIONS:
        pipe.llen(queue)
    pipe.hlen("unacked")
    *depths, unacked = pipe.execute()
    return RunProgress(run, datasets, dict(zip(PARTITIONS, depths, strict=True)), unacked)


def render(progress: RunProgress, elapsed_s: float | None = None) -> Table:
    title = f"run {progress.run} · queued " + ", ".join(f"{q} {n}" for q, n in progress.queued.items())
    table = Table(title=title + f" · running {progress.unacked}")
    for column in ("dataset", "total", "done", "pending", "failed", "rejected", "skipped",
                   "tokens", "reasoning %", "truncated %", "empty reasoning %"):
        table.add_column(column, justify="left" if column == "dataset" else "right")
    if elapsed_s:
        table.add_column("tok/s", justify="right")
    rows = progress.datasets + ([progress.totals()] if len(progress.datasets) > 1 else [])
    for d in rows:
        cells = [d.dataset, str(d.total), str(d.done), str(d.pending), _alert(d.failed), str(d.rejected),
                 str(d.skipped), f"{d.completion_tokens:,}", _percent(d.reasoning_tokens, d.completion_tokens),
                 _percent(d.truncated, d.done), _percent(d.empty_reasoning, d.done)]
        if elapsed_s:
            cells.append(f"{d.completion_tokens / elapsed_s:,.0f}")
        table.add_row(*cells, end_section=d.dataset == "all" or d is rows[-1])
    return table


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}" if whole else "-"


def wide_console() -> Console:
    """The table needs ~150 columns; a pipe or a log file gets them, a terminal keeps its width."""
    console = Console()
    return console if console.is_terminal else Console(width=160)


def _alert(count: int) -> str:
    return f"[red]{count}[/]" if count else "0"


def status_command(
    run: Annotated[str, typer.Option(help="Run id")],
    watch: Annotated[bool, typer.Option(help="Refresh every 2 s until interrupted")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
    redis_url: Annotated[Optional[str], typer.Option(help="Default: GENFLEET_REDIS_URL")] = None,
) -> None:
    """Per-dataset progress of a run."""
    client = connect(redis_url or get_settings().redis_url)
    console = wide_console()
    if as_json:
        progress = read_progress(client, run)
        print(json.dumps({**asdict(progress), "finished": progress.finished, "alarms": alarms(progress)}))
        return
    if not watch:
        progress = read_progress(client, run)
        console.print(render(progress))
        for line in alarms(progress):
            console.print(f"[bold red]ALARM[/] {escape(line)}")
        return
    from rich.live import Live
    with Live(render(read_progress(client, run)), console=console, refresh_per_second=1) as live:
        while True:
            time.sleep(2)
            live.update(render(read_progress(client, run)))
