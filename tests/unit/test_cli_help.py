"""Every command's `--help` at 80 columns (a pipe, `nohup`, a CI log, a narrow terminal) spells every
option name in full. Typer's rich help panels cut long names to fit (`--max-new-tokens-s…`); the
plain click layout puts a long name on its own line instead."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from genfleet.cli import app

COMMANDS = sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def test_every_command_is_checked():
    assert {"run", "enqueue", "worker", "status", "export", "doctor", "demo"} <= set(COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_help_at_80_columns_spells_every_option_name_in_full(name):
    command = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
    result = CliRunner().invoke(app, [name, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0, result.output
    names = [option for param in command.params if param.param_type_name == "option"
             for option in (*param.opts, *param.secondary_opts)]
    cut = [option for option in names if not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", result.output)]
    assert not cut, f"`genfleet {name} --help` at 80 columns cuts {cut}:\n{result.output}"


@pytest.mark.parametrize(("command", "not_loaded"), [("worker", "genfleet.producer"), ("enqueue", "genfleet.workers"),
                                                     ("run", "genfleet.workers.lifecycle")])
def test_a_command_imports_its_own_module_only(command, not_loaded):
    """Each process `genfleet run` starts pays only for its own command's imports (genfleet/cli.py)."""
    probe = (f"import sys; from genfleet import cli; sys.argv = ['genfleet', {command!r}, '--help']\n"
             "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
             f"print(sorted(m for m in sys.modules if m.startswith({not_loaded!r})))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout[-2000:]
