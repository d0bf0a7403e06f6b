"""`genfleet status` in a real terminal (tmux) at 100 and 120 columns: no row is wrapped, each
dataset's name and numbers stay on one line; `--watch` redraws one table in place (cut to a pane
too short for it), shows new numbers as they land, keeps its place when keys are typed, and ends
cleanly on Ctrl-C. Into a pipe: 120 columns, or every column with `--wide`.

The run's Redis state is written through the code paths the producer and the workers use
(`RunState`, `fleet_stats.completion_updates` via `helpers.run_stats.record_completion`,
`fleet_stats.publish`): four datasets (one of a million prompts, one with a long name), dead
letters, rates over the last minutes, two live workers.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis
from helpers.redis_server import observer
from helpers.run_stats import record_completion
from helpers.waits import wait_until

from genfleet.common import fleet_stats
from genfleet.common.keys import ManifestFields, RunKeys
from genfleet.common.records import TaskPayload
from genfleet.common.run_state import Outcome, RunState

needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None,
                                reason="tmux is not installed (apt-get install tmux): no terminal to render in")

RUN = "terminal"
LONG_NAME = "math_olympiad_reasoning_traces_v3_deduplicated_2024_12"
# dataset -> (total, done, dead-lettered, partition); what its row must show: done/total and %
DATASETS = {
    "chat": (250, 250, 0, "short"),
    "code_contests": (400, 200, 3, "short"),
    "webtext_multilingual": (1_000_000, 150, 0, "short"),
    LONG_NAME: (480, 120, 1, "long"),
}
ROWS = {"chat": ("250/250", "100.0"), "code_contests": ("200/400", "50.0"),
        "webtext_multilingual": ("150/1.00M", "0.0"), LONG_NAME: ("120/480", "25.0")}
UPSTREAM = "http://sglang-node-07.cluster.internal:30000"
REPO = Path(__file__).resolve().parents[2]


def fill_run(client: redis.Redis, run: str) -> None:
    """A run ten minutes in, as its producer and workers leave it in Redis."""
    now = time.time()
    state = RunState(client, run)
    client.hset(RunKeys(run).manifest, ManifestFields.CREATED_AT, now - 600)  # record() keeps the first
    for dataset, (total, done, dead, partition) in DATASETS.items():
        state.register_dataset(dataset, f"/data/{dataset}.jsonl")
        state.count(dataset, "total", total)
        for row in range(done):
            tokens = 200 + 37 * (row % 50)
            # A few empty reasonings and loops everywhere, below their alarms; one dataset's cap too low.
            state.mark_done(dataset, row, Outcome(60, tokens, tokens // 2,
                                                  truncated=row % (6 if dataset == LONG_NAME else 40) == 0,
                                                  empty_reasoning=row % 30 == 0, empty_content=False,
                                                  looped=row % 80 == 0))
            record_completion(client, run, dataset, partition, tokens, tokens / 40,
                              now=now - 540 + 540 * row / done)
        for row in range(done, done + dead):
            payload = TaskPayload(run=run, id=f"{dataset}/{row}", dataset=dataset, row=row, partition=partition,
                                  prompt_tokens=60, max_new_tokens=4096, messages=[{"role": "user", "content": "q"}])
            state.record_dead_letter(payload, "permanent", "HTTP 400: prompt too long", UPSTREAM)
            fleet_stats.record_failure(client, run, dataset, partition, now=now - 30)
    publish_beacons(client, run)


def publish_beacons(client: redis.Redis, run: str) -> None:
    for name, pool, in_flight in (("short-1", "short", {"short:code_contests": 24, "short:webtext_multilingual": 40}),
                                  ("long-1", "long", {f"long:{LONG_NAME}": 6})):
        fleet_stats.publish(client, fleet_stats.WorkerBeacon(
            name=name, pool=pool, slots=64, time=time.time(),
            upstreams=[fleet_stats.UpstreamHealth(UPSTREAM, True, sum(in_flight.values()))],
            in_flight={run: in_flight}))


class Tmux:
    """A tmux server of its own (a unique socket, no user config) whose panes stay after their
    command exits, so what it printed can still be read."""

    def __init__(self, workdir: Path) -> None:
        self.socket, self.workdir = f"genfleet-test-{uuid.uuid4().hex[:8]}", workdir
        self.config = workdir / "tmux.conf"
        self.config.write_text("set -g remain-on-exit on\nset -g status off\nset -g history-limit 5000\n"
                               "set -g default-shell /bin/sh\n")

    def tmux(self, *args: str) -> str:
        outside = {name: value for name, value in os.environ.items() if name != "TMUX"}  # pytest run in tmux
        return subprocess.run(["tmux", "-L", self.socket, "-f", str(self.config), *args], check=True,
                              capture_output=True, text=True, timeout=10, env=outside).stdout

    def start(self, session: str, columns: int, command: list[str], rows: int = 50) -> None:
        # COLUMNS and LINES unset: the pane's size is what the command must find on its own.
        # The exit status goes to a file: tmux 3.3a's #{pane_dead_status} stays empty now and then.
        # The shell's trap is a handler, not an ignore, so the command still gets Ctrl-C's SIGINT.
        line = (f"trap true INT; {shlex.join(['env', '-u', 'COLUMNS', '-u', 'LINES', 'LANG=C.UTF-8', *command])}; "
                f"echo $? > {shlex.quote(str(self.workdir / session))}.exit")
        self.tmux("new-session", "-d", "-s", session, "-x", str(columns), "-y", str(rows), "-c", str(REPO), line)

    def lines(self, session: str, *, joined: bool = False) -> list[str]:
        """The pane, scrollback included (-S -), trailing blanks stripped; `joined` (-J) joins the
        lines the terminal wrapped."""
        text = self.tmux("capture-pane", "-p", "-S", "-", *(["-J"] if joined else []), "-t", session)
        # Less tmux's own last line, "Pane is dead (status 0, ...)", once the command has exited.
        lines = [line.rstrip() for line in text.splitlines() if not line.startswith("Pane is dead")]
        while lines and not lines[-1]:
            lines.pop()
        return lines

    def settled(self, session: str) -> list[str]:
        """The pane once two captures in a row agree: never caught half-way through a redraw."""
        previous: list[list[str]] = [[]]

        def same() -> list[str] | None:
            now = self.lines(session)
            agreed, previous[0] = now == previous[0], now
            return now if agreed else None
        return wait_until(same, timeout=5, interval=0.05)

    def exit_status(self, session: str) -> int | None:
        """None while its command runs."""
        written = self.workdir / f"{session}.exit"
        return int(written.read_text()) if written.exists() and written.read_text().strip() else None

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=10)


@pytest.fixture(scope="module")
def filled(redis_server) -> tuple[redis.Redis, str]:
    """The run, written once for the module. The watch test finishes 100 more code_contests prompts:
    it comes after the test that checks code_contests' row (pytest runs a module in file order)."""
    client = observer(redis_server)
    client.flushall()
    fill_run(client, RUN)
    return client, redis_server


@pytest.fixture(scope="module")
def tmux(tmp_path_factory):
    server = Tmux(tmp_path_factory.mktemp("tmux"))
    yield server
    server.kill()


def status(redis_url: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "genfleet", "status", "--run", RUN, "--redis-url", redis_url, *args]


def row_of(lines: list[str], dataset: str, width: int) -> str:
    """The one line whose first cell is the dataset's name, whole or ellipsised in the middle."""
    found = [line for line in lines if len(cells := line.split()) > 2 and names(cells[0], dataset) and "/" in cells[1]]
    assert len(found) == 1, f"{dataset} at {width} columns:\n" + "\n".join(lines)
    return found[0]


def names(cell: str, dataset: str) -> bool:
    head, mark, tail = cell.partition("…")
    return cell == dataset or (bool(mark) and len(cell) >= 12 and dataset.startswith(head) and dataset.endswith(tail))


@needs_tmux
def test_status_fits_100_and_120_column_terminals_without_wrapping_a_row(tmux, filled):
    _, redis_url = filled
    for width in (100, 120):
        tmux.start(f"plain{width}", width, status(redis_url))
    for width in (100, 120):
        session = f"plain{width}"
        assert wait_until(lambda s=session: tmux.exit_status(s) is not None, timeout=20) is not None
        assert tmux.exit_status(session) == 0
        lines = tmux.lines(session)
        assert lines == tmux.lines(session, joined=True), f"a line wrapped at {width} columns"
        assert max(len(line) for line in lines) <= width
        assert sum(line.startswith(f"run {RUN} · ") for line in lines) == 1
        for dataset, (done_total, percent) in ROWS.items():
            row = row_of(lines, dataset, width)
            cells = row.split()
            assert cells[1:3] == [done_total, percent], row
            assert row.endswith("done") == (dataset == "chat"), row
        long_row = row_of(lines, LONG_NAME, width)
        assert "…" in long_row.split()[0] and LONG_NAME not in long_row
        assert any(line.startswith("short ") for line in lines) and any(line.startswith("long ") for line in lines)
        assert any(UPSTREAM in line for line in lines)
        if width == 120:  # every default column fits: none is named as hidden
            assert not any("hidden at" in line for line in lines)


@needs_tmux
def test_watch_redraws_one_table_in_place_and_ends_cleanly_on_ctrl_c(tmux, filled):
    client, redis_url = filled
    publish_beacons(client, RUN)
    tmux.start("watch", 100, status(redis_url, "--watch"))
    tmux.start("low", 100, status(redis_url, "--watch"), rows=12)  # shorter than the output
    for session in ("watch", "low"):
        wait_until(lambda s=session: shows(tmux.lines(s), "code_contests", "200/400"), timeout=20,
                   message=lambda s=session: "\n".join(tmux.lines(s)))
    first = tmux.settled("watch")
    tmux.tmux("send-keys", "-t", "watch", "q", "Enter")  # an operator's keys: not echoed, nothing moves
    # Prompts finish while it watches: 100 more of code_contests (200/400 -> 300/400).
    state = RunState(client, RUN)
    for row in range(400 - 100, 400):
        state.mark_done("code_contests", row, Outcome(60, 300, 150, False, False, False))
    for session in ("watch", "low"):
        wait_until(lambda s=session: shows(tmux.lines(s), "code_contests", "300/400"), timeout=10,
                   message=lambda s=session: "\n".join(tmux.lines(s)))
    second, low = tmux.settled("watch"), tmux.settled("low")
    for lines in (first, second, low):  # the scrollback included: redrawn in place, never scrolled
        assert sum(line.startswith(f"run {RUN} · ") for line in lines) == 1, "\n".join(lines)
        assert sum(line.startswith("dataset ") for line in lines) == 1, "\n".join(lines)
    assert row_of(second, "code_contests", 100).split()[1:3] == ["300/400", "75.0"]
    assert second == tmux.lines("watch", joined=True)
    assert len(low) == 12 and low[-1].strip() == "..."  # cut to the pane's height

    for session in ("watch", "low"):
        tmux.tmux("send-keys", "-t", session, "C-c")
    for session in ("watch", "low"):
        assert wait_until(lambda s=session: tmux.exit_status(s) is not None, timeout=10) is not None
        assert tmux.exit_status(session) == 0
        after = tmux.lines(session)
        assert not any("Traceback" in line or "KeyboardInterrupt" in line or "Aborted" in line for line in after)
        assert sum(line.startswith(f"run {RUN} · ") for line in after) == 1  # the last table stays, once


def shows(lines: list[str], dataset: str, done_total: str) -> bool:
    return any(line.split()[:2] == [dataset, done_total] for line in lines)


def test_into_a_pipe_status_takes_120_columns_and_wide_every_column(filled):
    _, redis_url = filled
    env = {name: value for name, value in os.environ.items() if name not in ("COLUMNS", "LINES")}
    running = [subprocess.Popen(status(redis_url, *args), stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
               for args in ((), ("--wide",))]
    default, wide = (process.communicate(timeout=30)[0].splitlines() for process in running)
    assert [process.returncode for process in running] == [0, 0]

    assert max(len(line) for line in default) == 120  # the long name takes what the other columns leave
    assert any(line.startswith("partitions ") for line in default) and any("in flight" in line for line in default)
    assert any(line.split() == ["dataset", "done/total", "%", "failed", "1m", "1m", "trunc", "%", "loop", "%",
                                "reas.", "%", "ETA"] for line in default), "\n".join(default)
    assert row_of(default, "webtext_multilingual", 120).split()[1] == "150/1.00M"

    header = next(line for line in wide if "tokens p50·mean·p99" in line)
    for heading in ("partition", "in flight", "rejected", "skipped", "req/min 1m·10m", "empty reas. %"):
        assert heading in header
    assert 120 < max(len(line) for line in wide) <= 220
    assert any("webtext_multilingual" in line and "1,000,000" in line for line in wide), "\n".join(wide)
