"""A simulated SGLang server in a subprocess, for tests that talk to it over real HTTP, the
simulator settings several test files run it with, and the completion log it writes."""
from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

from helpers.paths import REPO
from helpers.waits import WaitTimeout, wait_until

STARTUP_TIMEOUT_S = 30.0
PORT_ATTEMPTS = 3  # free_port() can race with another process grabbing the same port

# Short completions (5% of the default lengths) at 400 tok/s: a run of a few hundred prompts in seconds.
FAST_SIM = ("--length-scale", "0.05", "--rate", "400")
# Near-constant completions of ~1 s (40 tok/s) and ~2 s (20 tok/s): long enough to be caught mid-flight.
ONE_SECOND = ("--rate", "40", "--knee", "100000", "--length-median", "40", "--length-mean", "41")
TWO_SECONDS = ("--rate", "20", "--knee", "100000", "--length-median", "40", "--length-mean", "41")


def read_completion_log(path: Path | str) -> list[dict[str, Any]]:
    """Every line of a completion log (`--log-completions`), in the order the responses finished.
    Its format is documented in genfleet/sim/server.py's module docstring."""
    with open(path, encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class SimProcess:
    """`python -m genfleet.sim --port P *flags`, healthy on entry, stopped (then killed) on exit.

    >>> with SimProcess("--rate", "1000", "--length-scale", "0.05") as sim:
    ...     httpx.post(f"{sim.url}/generate", json={"text": "hi"})
    """

    def __init__(self, *flags: str, port: int | None = None, startup_timeout: float = STARTUP_TIMEOUT_S) -> None:
        self.flags = list(flags)
        self._fixed_port = port
        self.port = port or 0
        self.startup_timeout = startup_timeout
        self._dir = Path(tempfile.mkdtemp(prefix="genfleet-sim-"))
        self.log_path = self._dir / "sim.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> SimProcess:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        for attempt in range(1, PORT_ATTEMPTS + 1):
            self.port = self._fixed_port or free_port()
            self._spawn()
            try:
                self._wait_healthy()
                return
            except RuntimeError:
                lost_port_race = "address already in use" in self.log_tail().lower()
                if self._fixed_port or not lost_port_race or attempt == PORT_ATTEMPTS:
                    raise

    def stop(self, timeout: float = 5.0) -> None:
        """Terminate, then kill if it lingers; removes the log directory."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        shutil.rmtree(self._dir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL: the host vanishes mid-flight."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the process to exit by itself and return its status."""
        assert self.process is not None, "not started"
        return self.process.wait(timeout)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stats(self) -> dict[str, Any]:
        return sim_stats(self.url)

    def reset_stats(self) -> dict[str, Any]:
        return httpx.post(f"{self.url}/sim/stats/reset", timeout=5).raise_for_status().json()

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""

    def _spawn(self) -> None:
        command = [sys.executable, "-m", "genfleet.sim", "--port", str(self.port), *self.flags]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)

    def _wait_healthy(self) -> None:
        def healthy() -> bool:
            if not self.alive:
                raise RuntimeError(f"sim exited during startup:\n{self.log_tail()}")
            return httpx.get(f"{self.url}/health", timeout=1).status_code == 200

        try:
            wait_until(healthy, self.startup_timeout, 0.05, "sim not healthy", ignore=(httpx.TransportError,))
        except WaitTimeout:
            self.kill()
            raise RuntimeError(f"sim not healthy after {self.startup_timeout:g}s:\n{self.log_tail()}") from None


def sim_stats(url: str) -> dict[str, Any]:
    """A simulator's `/sim/stats`, wherever it runs (a process, or a thread of the test)."""
    return httpx.get(f"{url}/sim/stats", timeout=5).raise_for_status().json()
