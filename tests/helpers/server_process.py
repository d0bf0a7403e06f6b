"""A real inference server (SGLang's, vLLM's) as a test fixture: one process tree in its own session,
on a free loopback port, so that it can be killed whole (a host that vanishes mid-flight) and
started again where it was (a host that comes back). Each tier says how to start its server and
when it is ready (tests/sglang_real/server.py, tests/vllm_real/server.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from pathlib import Path

import httpx

from helpers.sim_process import free_port
from helpers.waits import WaitTimeout, wait_until

STARTUP_TIMEOUT_S = 600.0  # 30-55 s alone; ~200 s seen with several starting on a busy 2-core machine


class ServerProcess:
    """Subclasses give `command()` (for `self.port`), `environment()` and `ready()`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.port = 0
        self._dir = Path(tempfile.mkdtemp(prefix=f"genfleet-{name}-"))
        self.log_path = self._dir / "server.log"
        self.process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spawn(self, *, same_port: bool = False) -> ServerProcess:
        """Starts the server; `same_port`: where it ran before (a host that comes back)."""
        self.port = self.port if same_port and self.port else free_port()
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                            env={**os.environ, **self.environment()}, start_new_session=True)
        return self

    def wait_healthy(self, timeout: float = STARTUP_TIMEOUT_S) -> ServerProcess:
        def healthy() -> bool:
            if not self.alive:
                raise RuntimeError(f"{self.name} exited during startup:\n{self.log_tail()}")
            return self.ready()

        try:
            wait_until(healthy, timeout, 0.5, f"{self.name} not healthy", ignore=(httpx.TransportError,))
        except WaitTimeout:
            self.kill()
            raise RuntimeError(f"{self.name} not healthy after {timeout:g}s:\n{self.log_tail()}") from None
        return self

    def start(self) -> ServerProcess:
        return self.spawn().wait_healthy()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL to the whole tree: the host vanishes mid-flight."""
        if self.process is not None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def log_tail(self, chars: int = 5000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""
