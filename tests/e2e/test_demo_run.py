"""`genfleet demo` is `genfleet run` with the simulator as a server the job owns: the job starts it
before anything asks it for work, ends (exit 1, naming its log) if it dies, keeps everything up
after the summary with `--hold`, and stops it with the rest. Real processes: the demo, its embedded
redis-server, the simulator, Flower and the workers; its output goes to a file (no terminal)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from helpers.sim_process import free_port
from helpers.waits import wait_until


class Demo:
    def __init__(self, root: Path, *args: str) -> None:
        self.log = root / "demo.log"
        env = {key: value for key, value in os.environ.items() if not key.startswith("GENFLEET_")}
        env.update({"GENFLEET_METRICS_PORT": "0", "GENFLEET_SHUTDOWN_GRACE_S": "5"})
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "genfleet", "demo", "--workdir", str(root / "demo"), "--scale", "0.02", *args],
                cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float = 120) -> str:
        def seen() -> str | None:
            if self.process.poll() is not None:
                raise AssertionError(f"the demo exited ({self.process.returncode}):\n{self.output()[-4000:]}")
            return self.output() if text in self.output() else None

        return wait_until(seen, timeout, 0.2, lambda: f"{text!r} not printed:\n{self.output()[-4000:]}")

    def simulator(self) -> str:
        """The simulator's URL, as the job's header names it."""
        match = re.search(r"genfleet run \S+ · (http://127\.0\.0\.1:\d+)", self.output())
        assert match, self.output()[-4000:]
        return match.group(1)

    def end(self, timeout: float = 90) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the demo did not end within {timeout} s:\n{self.output()[-4000:]}") from None

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)  # its children die with it (PDEATHSIG)
            self.process.wait()


@pytest.fixture
def demo(tmp_path):
    started: list[Demo] = []

    def start(*args: str) -> Demo:
        started.append(Demo(tmp_path, *args))
        return started[-1]

    yield start
    for each in started:
        each.kill()


def answers(url: str) -> int | None:
    """The HTTP status `url` answers with, or None when nothing listens there."""
    try:
        return httpx.get(url, timeout=5).status_code
    except httpx.ConnectError:
        return None


def pids_listening_on(port: int) -> list[int]:
    """The processes whose command line carries `--port {port}` (the simulator the job started)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if entry.name.isdigit() and b"--port" in words and str(port).encode() in words:
            found.append(int(entry.name))
    return found


def test_with_hold_everything_stays_up_after_the_summary_and_one_ctrl_c_stops_it_all(demo):
    flower_port = free_port()
    running = demo("--sim-rate", "2000", "--flower-port", str(flower_port), "--hold")
    output = running.wait_for("Ctrl-C to stop")
    assert re.search(r"done: 29 prompts, 0 failed", output), output[-3000:]
    simulator = running.simulator()
    assert answers(f"{simulator}/health") == 200
    assert answers(f"http://127.0.0.1:{flower_port}/") == 401  # Flower, behind its basic auth

    running.process.send_signal(signal.SIGINT)
    assert running.end() == 128 + signal.SIGINT
    assert answers(f"{simulator}/health") is None and answers(f"http://127.0.0.1:{flower_port}/") is None


def test_when_its_simulator_dies_the_demo_ends_with_exit_1_naming_the_log(demo):
    running = demo("--sim-rate", "5", "--no-flower")  # slow: still generating when the simulator dies
    running.wait_for("Ctrl-C stops")
    port = int(running.simulator().rsplit(":", 1)[1])
    (simulator,) = pids_listening_on(port)
    os.kill(simulator, signal.SIGKILL)

    assert running.end() == 1
    assert re.search(r"error: sim exited \(-9\); see \S+sim\.log", running.output()), running.output()[-3000:]
