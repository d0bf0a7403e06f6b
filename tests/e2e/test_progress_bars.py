"""Progress bars of `genfleet export` and `genfleet requeue`: drawn with their counts, rate and ETA when
stderr is a terminal (a pseudo-terminal here, the command in its own process), and never into a pipe,
where scripts and tests read only the commands' own lines."""
from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from helpers.export_runs import run_export, synthetic_run
from helpers.redis_server import observer
from rich.console import Console
from rich.progress import Progress
from typer.testing import CliRunner

from genfleet.cli import app
from genfleet.common.records import TaskPayload
from genfleet.common.run_state import RunState
from genfleet.progress import BYTES, RateColumn

ANSI_FREE = {"NO_COLOR": "1", "COLUMNS": "200", "TERM": "xterm"}


def on_terminal(*argv: str, timeout: float = 60) -> tuple[int, str, str]:
    """`genfleet ARGV` in its own process with stderr on a pseudo-terminal: its exit code, its stdout
    (a pipe) and everything the terminal was sent."""
    master, slave = os.openpty()
    env = {**os.environ, **ANSI_FREE}
    process = subprocess.Popen([sys.executable, "-m", "genfleet", *argv], stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    shown, deadline = bytearray(), time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                continue
            try:
                data = os.read(master, 1 << 16)
            except OSError:  # EIO: the command exited and closed the terminal
                break
            if not data:
                break
            shown += data
        stdout = process.communicate(timeout=max(1.0, deadline - time.monotonic()))[0].decode()
    finally:
        os.close(master)
        if process.poll() is None:
            process.kill()
    return process.returncode, stdout, shown.decode(errors="replace")


def dead_letters(client: redis.Redis, run: str, count: int) -> None:
    state = RunState(client, run)
    for row in range(count):
        payload = TaskPayload(run=run, id=f"d/{row}", dataset="d", row=row, partition="short", prompt_tokens=5,
                              max_new_tokens=10, messages=[{"role": "user", "content": "q"}])
        state.record_dead_letter(payload, "exhausted", "upstream kept failing", "http://sim")


@pytest.fixture
def own_database(redis_server: str):
    """A database of the session's Redis for requeue's messages, emptied after: no later test's worker
    may take them."""
    url = redis_server.rsplit("/", 1)[0] + "/9"
    client = observer(url)
    client.flushdb()
    yield url, client
    client.flushdb()


def test_export_on_a_terminal_shows_each_phase_with_its_eta_and_keeps_stdout_for_the_tables(redis_server, tmp_path):
    client = observer(redis_server)
    synthetic_run(tmp_path / "shards", client, "bars", 40)
    code, stdout, shown = on_terminal("export", "--run", "bars", "--from", str(tmp_path / "shards"), "--out",
                                      str(tmp_path / "out"), "--format", "openai", "--redis-url", redis_server)
    assert code == 0, shown
    assert "reading shards" in shown and "40 records" in shown and "reconciling with Redis" in shown
    assert "ETA" in shown
    assert "reading shards" not in stdout and "export · run bars" in stdout


def test_requeue_on_a_terminal_counts_the_letters_moved_and_prints_its_line_to_stdout(own_database):
    url, client = own_database
    dead_letters(client, "bars", 3)
    code, stdout, shown = on_terminal("requeue", "--run", "bars", "--redis-url", url)
    assert code == 0, shown
    assert "requeueing dead letters" in shown and "3/3" in shown and "ETA" in shown
    assert stdout == "requeued 3 dead letters of run bars\n"
    assert client.llen("short") == 3


def test_no_progress_bar_reaches_captured_output(redis_server, own_database, tmp_path):
    client = observer(redis_server)
    synthetic_run(tmp_path / "shards", client, "piped", 10)
    code, output, _ = run_export("piped", (tmp_path / "shards",), tmp_path / "out", "--format", "openai",
                                 redis_url=redis_server)
    assert code == 0 and "reading shards" not in output and "ETA" not in output, output
    url, own = own_database
    dead_letters(own, "piped", 2)
    result = CliRunner().invoke(app, ["requeue", "--run", "piped", "--redis-url", url], catch_exceptions=False)
    assert result.exit_code == 0 and result.output == "requeued 2 dead letters of run piped\n"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(("unit", "shown"), [(BYTES, "2.5 MB/s"), ("items", "2.5×10³ it/s")])
def test_the_rate_column_reads_bytes_as_megabytes_and_items_as_items_per_second(unit, shown):
    clock = Clock()
    progress = Progress(console=Console(file=open(os.devnull, "w")), get_time=clock)  # noqa: SIM115
    task = progress.add_task("phase", total=10_000_000, unit=unit)
    progress.update(task, advance=0)
    for _ in range(4):
        clock.now += 1.0
        progress.update(task, advance=2_500 if unit == "items" else 2_500_000)
    assert RateColumn().render(progress.tasks[0]).plain == shown
    progress.console.file.close()


def test_a_rate_is_blank_until_there_is_one(tmp_path: Path):
    progress = Progress(console=Console(file=(tmp_path / "bars").open("w")), get_time=Clock())
    task = progress.add_task("phase", total=10, unit="items")
    assert RateColumn().render(progress.tasks[task]).plain == ""
    progress.console.file.close()
