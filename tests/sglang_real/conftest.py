"""Fixtures of the real-server tier (`make test-sglang`): SGLang 0.5.23's own server with the plan's
forward pass, and the fleet from tests/conftest.py (redis-server, `genfleet` processes) against it.

Two servers are shared by the whole session, started at once (each takes 30-45 s):
- `cumulative`: the default stream mode (each chunk carries the whole text so far), `--reasoning-parser
  kimi_k2`;
- `incremental`: `--incremental-streaming-output` (chunks are deltas), `--reasoning-parser deepseek-r1`.
Both parsers start inside the reasoning, as the tier's template opens `<think>` in the prompt.
A test that kills a server or needs other flags starts its own.
"""
from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import model_dir as tier_model  # noqa: E402
from plan import PlanVocab  # noqa: E402
from server import RealServer, sglang_venv  # noqa: E402


@pytest.fixture(scope="session")
def venv() -> Path:
    return sglang_venv()


@pytest.fixture(scope="session")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen3 model directory (config + tokenizer), built for this session."""
    return tier_model.build(tmp_path_factory.mktemp("model") / "tiny-qwen3")


@pytest.fixture(scope="session")
def plan_vocab(model: Path) -> PlanVocab:
    return PlanVocab.from_dir(model)


@pytest.fixture(scope="session")
def servers(venv: Path, model: Path) -> Iterator[dict[str, RealServer]]:
    started = {
        # A weight version of each server's own: records must carry the one their server reports.
        "cumulative": RealServer(venv, model, "--reasoning-parser", "kimi_k2", "--weight-version", "plan-cumulative-w1",
                                 name="cumulative"),
        "incremental": RealServer(venv, model, "--incremental-streaming-output", "--reasoning-parser", "deepseek-r1",
                                  "--weight-version", "plan-incremental-w1", name="incremental"),
    }
    try:
        for server in started.values():
            server.spawn()
        for server in started.values():
            server.wait_healthy()
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture(scope="session")
def cumulative(servers: dict[str, RealServer]) -> RealServer:
    return servers["cumulative"]


@pytest.fixture(scope="session")
def incremental(servers: dict[str, RealServer]) -> RealServer:
    return servers["incremental"]


@pytest.fixture
def real_fleet(fleet, model: Path):
    """The fleet of tests/conftest.py, templating with the tier's tokenizer and splitting on ids."""
    fleet.configure(tokenizer=model)
    return fleet
