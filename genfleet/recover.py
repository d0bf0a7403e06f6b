"""`genfleet recover`: a run's done state in Redis rebuilt from its records on disk, after Redis
lost its data (what it rebuilds and what it cannot: common/rebuild.py; the runbook:
docs/running.md, "If Redis lost its data")."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from genfleet.common.rebuild import recover
from genfleet.common.run_state import RunState, connect
from genfleet.common.settings import Settings
from genfleet.onebox.embedded_redis import reach_redis


def recover_command(
    run: Annotated[str, typer.Option(help="Run id")],
    from_dirs: Annotated[list[Path], typer.Option(
        "--from", help="An output directory holding the run's shards (GENFLEET_OUTPUT_DIR of a host); repeat "
        "for each host's, or run recover on each host")],
    redis_url: Annotated[Optional[str], typer.Option(help="Default: GENFLEET_REDIS_URL")] = None,
) -> None:
    """Rebuild a run's done state in Redis from its records on disk, after Redis lost its data."""
    from rich.console import Console
    from rich.table import Table

    settings = Settings()
    for directory in from_dirs:
        if not directory.is_dir():
            raise typer.BadParameter(f"{directory} is not a directory", param_hint="--from")
    with reach_redis(redis_url, *from_dirs) as url:
        state = RunState(connect(url, timeout_s=30.0), run)
        found = recover(state, from_dirs, reasoning_parser=settings.reasoning_parser)
    console = Console()
    table = Table(title=f"recovered from the shards · run {run}")
    for column in ("dataset", "records", "settled now", "already settled", "without a row"):
        table.add_column(column, justify="left" if column == "dataset" else "right")
    for dataset in sorted(found.records):
        with_row = found.records[dataset] - found.without_row[dataset]
        table.add_row(dataset, f"{found.records[dataset]:,}", f"{found.settled[dataset]:,}",
                      f"{with_row - found.settled[dataset]:,}", f"{found.without_row[dataset]:,}")
    console.print(table)
    if not found.records:
        console.print(f"no record of run {run} under {', '.join(map(str, from_dirs))}")
    if found.torn:
        console.print(f"{found.torn} torn last lines of open shards skipped (never acknowledged: regenerated)")
    console.print(f"next: re-run `genfleet enqueue --run {run}` with the same datasets: it publishes only the "
                  "rows with no record")
