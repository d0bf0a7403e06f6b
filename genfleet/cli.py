"""The `genfleet` console script: gathers the commands each part contributes.

A command's module is imported only when that command runs: `genfleet worker` does not load the
producer, nor `genfleet enqueue` Celery's worker side. Every process `genfleet run` starts is a
`genfleet` command, and on a small machine their imports share its cores with the server and each
other. Listing the commands (`genfleet --help`, `genfleet` alone, a name misspelt) imports them all,
for their help lines.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from importlib import import_module
from importlib.metadata import version
from typing import Annotated, Any

import typer

from genfleet import ToolError

# Each command: where its function lives, "module:function", in the order `--help` lists them.
COMMANDS = {
    "run": "genfleet.onebox.command:run_command",
    "enqueue": "genfleet.producer.command:enqueue_command",
    "worker": "genfleet.workers.command:worker_command",
    "status": "genfleet.status.command:status_command",
    "sim": "genfleet.sim.command:sim_command",
    "flower": "genfleet.workers.command:flower_command",
    "failures": "genfleet.requeue:failures_command",
    "requeue": "genfleet.requeue:requeue_command",
    "recover": "genfleet.recover:recover_command",
    "export": "genfleet.export.command:export_command",
    "doctor": "genfleet.doctor.command:doctor_command",
    "demo": "genfleet.demo:demo_command",
}


def _print_version(requested: bool) -> None:
    if requested:
        # The installed distribution's version (pyproject.toml's), not a constant kept by hand.
        typer.echo(f"genfleet {version('genfleet')}")
        raise typer.Exit()


def _options(
    _version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True, help="Print genfleet's version and exit.")] = False,
) -> None:
    pass


def command_function(name: str) -> Callable[..., Any]:
    module, function = COMMANDS[name].split(":")
    return getattr(import_module(module), function)


def build_app(names: list[str] | None = None) -> typer.Typer:
    """The CLI with the commands named (default: all of them)."""
    # typer's --install-completion and --show-completion (add_completion is on by default; typer 0.29
    # typer/completion.py): bash, zsh, fish, PowerShell, the shell found among the parent processes.
    cli = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                      help="Run large prompt datasets through SGLang servers as a Celery fleet.")
    cli.callback()(_options)
    for name in names or list(COMMANDS):
        cli.command(name)(command_function(name))
    return cli


def __getattr__(name: str) -> typer.Typer:
    """`genfleet.cli.app`: the whole CLI (the tests' and typer's entry to it), built on first use."""
    if name == "app":
        globals()["app"] = built = build_app()
        return built
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    invoked = sys.argv[1] if len(sys.argv) > 1 else None
    try:
        build_app([invoked] if invoked in COMMANDS else None)()
    except ToolError as error:
        # An operator tool's failure is one line naming what and where (a missing redis-server, an
        # embedded Redis that would not start), not a traceback.
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
