"""The `genfleet` console script: gathers the commands each part contributes."""
from __future__ import annotations

import typer

from common.status import status_command
from producer.cli import enqueue_command
from sim.cli import sim_command
from workers.cli import failures_command, flower_command, requeue_command, worker_command
from workers.export_cli import export_command

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Run large prompt datasets through SGLang servers as a Celery fleet.")
app.command("enqueue")(enqueue_command)
app.command("worker")(worker_command)
app.command("status")(status_command)
app.command("sim")(sim_command)
app.command("flower")(flower_command)
app.command("failures")(failures_command)
app.command("requeue")(requeue_command)
app.command("export")(export_command)


def main() -> None:
    app()
