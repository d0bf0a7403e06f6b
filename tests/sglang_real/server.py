"""SGLang 0.5.23's own server as a test fixture (helpers/server_process.py): `serve.py` run by the
tier's SGLang venv, its forward pass replaced by the plan, healthy on return.

The CPU engine's settings (SGLANG_USE_CPU_ENGINE=1, `--device cpu --load-format dummy
--attention-backend torch_native --disable-cuda-graph`) are fixed here; a test adds the flags it is
about (`--incremental-streaming-output`, `--reasoning-parser`, `--max-total-tokens`, ...).
`--sleep-on-idle`: an idle scheduler otherwise polls at ~95% of a core (measured), and this
machine has two.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
from helpers.server_process import ServerProcess
from helpers.waits import wait_until

HERE = Path(__file__).resolve().parent
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


class RealServer(ServerProcess):
    """One SGLang server process tree (HTTP + scheduler + detokenizer)."""

    def __init__(self, venv: Path, model_dir: Path, *flags: str, name: str = "sglang",
                 env: dict[str, str] | None = None) -> None:
        super().__init__(name)
        self.venv = venv
        self.extra_env = env or {}
        self.model_dir = model_dir
        self.flags = list(flags)

    def command(self) -> list[str]:
        return [str(self.venv / "bin" / "python"), str(HERE / "serve.py"), "--model-path", str(self.model_dir),
                "--host", "127.0.0.1", "--port", str(self.port), *CPU_ENGINE, *DEFAULT_FLAGS, *self.flags]

    def environment(self) -> dict[str, str]:
        return {"SGLANG_USE_CPU_ENGINE": "1", "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE / "stand_ins")]),
                # One OpenMP thread each: several servers and the fleet share two cores.
                "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **self.extra_env}

    def ready(self) -> bool:
        # 200 only once SGLang's own warm-up generation has run (0.5.23 `/health` is 503 before).
        return httpx.get(f"{self.url}/health", timeout=2).status_code == 200

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
