"""Fixtures shared by both tiers: a redis-server on a free port (one per session, flushed for each
test), the test tokenizer and vocabulary, and a real fleet of `genfleet worker` processes.

`tests/unit/` starts nothing but that redis-server, and only where Redis itself is the subject;
`tests/e2e/` runs the simulator over HTTP and Celery workers as separate processes. What both share
is in `tests/helpers/` (importable as `helpers`)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers.fleet import Fleet  # noqa: E402
from helpers.paths import TOKENIZER  # noqa: E402
from helpers.redis_server import RedisServer, observer  # noqa: E402


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A real-server test that SIGKILLs a server runs last: nothing after it shares what it broke.
    items.sort(key=lambda item: item.get_closest_marker("kills_a_server") is not None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kills_a_server: starts and SIGKILLs servers of its own; runs last")

@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory):
    # AOF on, as genfleet requires (or workers warn and `status` alarms); never fsynced: a test needs no durability.
    server = RedisServer(tmp_path_factory.mktemp("redis"), "--appendonly", "yes", "--appendfsync", "no")
    server.start()
    yield server.url
    server.stop()


@pytest.fixture
def redis_url(redis_server: str) -> str:
    """A clean database for each test."""
    observer(redis_server).flushall()
    return redis_server


@pytest.fixture
def redis_client(redis_url: str) -> redis.Redis:
    return observer(redis_url)


@pytest.fixture
def fleet(redis_url: str, tmp_path: Path):
    with Fleet(redis_url, tmp_path) as running:
        yield running


@pytest.fixture(scope="session")
def tokenizer():
    """The simulator's tokenizer (sim/model), as workers and the producer load it."""
    from genfleet.common.tokenizer import load_tokenizer

    return load_tokenizer(TOKENIZER)


@pytest.fixture(scope="session")
def vocab():
    """The simulator's view of the same vocabulary."""
    from genfleet.sim.vocab import SimVocab

    return SimVocab.from_tokenizer_dir(TOKENIZER)


@pytest.fixture(scope="session")
def prompt(vocab) -> list[int]:
    """The ids of the chat prompt the simulator tests ask with; it opens <think>."""
    from helpers.sim_plans import CHAT_PROMPT

    ids = vocab.encode(CHAT_PROMPT)
    assert ids[-1] == vocab.think_start_id
    return ids


@pytest.fixture
def sglang_server():
    """The workers' SGLang server seam (`workers/servers/sglang.py`), closed after the test."""
    from genfleet.workers.servers.sglang import SglangServer

    server = SglangServer(max_connections=16, connect_timeout_s=5, stall_timeout_s=30)
    yield server
    server.close()
