"""The `genfleet` console script: gathers the commands each part contributes."""
from __future__ import annotations

import typer

from genfleet.export.cli import export_command
from genfleet.failures import failures_command, requeue_command
from genfleet.status.command import status_command
from producer.cli import enqueue_command
from sim.cli import sim_command
from workers.cli import flower_command, worker_command

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
