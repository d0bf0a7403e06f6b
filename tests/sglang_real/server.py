"""SGLang 0.5.23's own server as a test fixture: `serve.py` run by the tier's SGLang venv on a free
loopback port, its forward pass replaced by the plan, healthy on return.

The CPU engine's settings (SGLANG_USE_CPU_ENGINE=1, `--device cpu --load-format dummy
--attention-backend torch_native --disable-cuda-graph`) are fixed here; a test adds the flags it is
about (`--incremental-streaming-output`, `--reasoning-parser`, `--max-total-tokens`, ...).
`--sleep-on-idle`: an idle scheduler otherwise polls at ~95% of a core (measured), and this
machine has two.
"""
from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import httpx
from helpers.sim_process import free_port
from helpers.waits import WaitTimeout, wait_until

HERE = Path(__file__).resolve().parent
STARTUP_TIMEOUT_S = 600.0  # 30-45 s alone; ~200 s seen with several starting on a busy 2-core machine
CPU_ENGINE = ("--device", "cpu", "--load-format", "dummy", "--attention-backend", "torch_native",
              "--disable-cuda-graph", "--sleep-on-idle")
# KV for 65,536 tokens (SGLang would otherwise size it from free memory: 15 GB here).
DEFAULT_FLAGS = ("--max-total-tokens", "65536", "--log-level", "warning")


def sglang_venv() -> Path:
    """The tier's venv: `GENFLEET_SGLANG_VENV`, or built (once) by venv.sh."""
    if os.environ.get("GENFLEET_SGLANG_VENV"):
        return Path(os.environ["GENFLEET_SGLANG_VENV"])
    result = subprocess.run([str(HERE / "venv.sh")], capture_output=True, text=True, check=True)
    return Path(result.stdout.strip().splitlines()[-1])


class RealServer:
    """One SGLang server process tree (HTTP + scheduler + detokenizer), in its own session so it
    can be killed whole."""

    def __init__(self, venv: Path, model_dir: Path, *flags: str, name: str = "sglang",
                 env: dict[str, str] | None = None) -> None:
        self.venv = venv
        self.extra_env = env or {}
        self.model_dir = model_dir
        self.flags = list(flags)
        self.name = name
        self.port = 0
        self._dir = Path(tempfile.mkdtemp(prefix=f"genfleet-{name}-"))
        self.log_path = self._dir / "server.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spawn(self, *, same_port: bool = False) -> RealServer:
        """Starts the server; `same_port`: where it ran before (a host that comes back)."""
        self.port = self.port if same_port and self.port else free_port()
        env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1",
               "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE / "stand_ins")]),
               # One OpenMP thread each: several servers and the fleet share two cores.
               "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **self.extra_env}
        command = [str(self.venv / "bin" / "python"), str(HERE / "serve.py"), "--model-path", str(self.model_dir),
                   "--host", "127.0.0.1", "--port", str(self.port), *CPU_ENGINE, *DEFAULT_FLAGS, *self.flags]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True)
        return self

    def wait_healthy(self, timeout: float = STARTUP_TIMEOUT_S) -> RealServer:
        def healthy() -> bool:
            if not self.alive:
                raise RuntimeError(f"{self.name} exited during startup:\n{self.log_tail()}")
            # 200 only once SGLang's own warm-up generation has run (0.5.23 `/health` is 503 before).
            return httpx.get(f"{self.url}/health", timeout=2).status_code == 200

        try:
            wait_until(healthy, timeout, 0.5, f"{self.name} not healthy", ignore=(httpx.TransportError,))
        except WaitTimeout:
            self.kill()
            raise RuntimeError(f"{self.name} not healthy after {timeout:g}s:\n{self.log_tail()}") from None
        return self

    def start(self) -> RealServer:
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
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def get(self, path: str) -> Any:
        return httpx.get(f"{self.url}{path}", timeout=10).raise_for_status().json()

    def load(self) -> dict[str, Any]:
        """The scheduler's load, as `/v1/loads` reports it (0.5.23 `entrypoints/v1_loads.py`)."""
        return self.get("/v1/loads")["loads"][0]

    def flush_cache(self, timeout: float = 30.0) -> None:
        """Empties the radix cache. 0.5.23 `POST /flush_cache` (`entrypoints/http_server.py`) answers
        400 and flushes nothing while a request runs or waits (`Scheduler.flush_cache`): asked again
        until the scheduler is idle."""
        wait_until(lambda: httpx.post(f"{self.url}/flush_cache", timeout=10).status_code == 200, timeout, 0.2,
                   f"{self.name} did not flush its cache", ignore=(httpx.TransportError,))

    def log_tail(self, chars: int = 5000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""
