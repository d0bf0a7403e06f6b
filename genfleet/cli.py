"""The `genfleet` console script: gathers the commands each part contributes."""
from __future__ import annotations

import sys
from importlib.metadata import version
from typing import Annotated

import typer

from genfleet import ToolError
from genfleet.demo import demo_command
from genfleet.doctor.command import doctor_command
from genfleet.export.command import export_command
from genfleet.onebox.command import run_command
from genfleet.producer.command import enqueue_command
from genfleet.recover import recover_command
from genfleet.requeue import failures_command, requeue_command
from genfleet.sim.command import sim_command
from genfleet.status.command import status_command
from genfleet.workers.command import flower_command, worker_command

# typer's --install-completion and --show-completion (add_completion is on by default; typer 0.29
# typer/completion.py): bash, zsh, fish, PowerShell, the shell found among the parent processes.
app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                  help="Run large prompt datasets through SGLang servers as a Celery fleet.")
app.command("run")(run_command)
app.command("enqueue")(enqueue_command)
app.command("worker")(worker_command)
app.command("status")(status_command)
app.command("sim")(sim_command)
app.command("flower")(flower_command)
app.command("failures")(failures_command)
app.command("requeue")(requeue_command)
app.command("recover")(recover_command)
app.command("export")(export_command)
app.command("doctor")(doctor_command)
app.command("demo")(demo_command)


def _print_version(requested: bool) -> None:
    if requested:
        # The installed distribution's version (pyproject.toml's), not a constant kept by hand.
        typer.echo(f"genfleet {version('genfleet')}")
        raise typer.Exit()


@app.callback()
def _options(
    _version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True, help="Print genfleet's version and exit.")] = False,
) -> None:
    pass


def main() -> None:
    try:
        app()
    except ToolError as error:
        # An operator tool's failure is one line naming what and where (a missing redis-server, an
        # embedded Redis that would not start), not a traceback.
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
