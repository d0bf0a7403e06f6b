"""Fixtures for a real fleet: redis-server on a free port, the simulator over HTTP, Celery workers
as separate processes (the same `genfleet worker` a user runs)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

sys.path.insert(0, str(Path(__file__).parent))

from fleet import Fleet  # noqa: E402
from sim_process import free_port  # noqa: E402


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory):
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed: `apt-get install redis-server` (make test does it as root)")
    port = free_port()
    workdir = tmp_path_factory.mktemp("redis")
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir), "--save", "",
         "--appendonly", "no", "--maxmemory-policy", "noeviction"],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    else:
        process.kill()
        pytest.fail("redis-server did not start")
    yield url
    process.terminate()
    process.wait(timeout=10)


@pytest.fixture
def redis_url(redis_server: str) -> str:
    """A clean database for each test."""
    redis.Redis.from_url(redis_server).flushall()
    return redis_server


@pytest.fixture
def redis_client(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


@pytest.fixture
def fleet(redis_url: str, tmp_path: Path):
    with Fleet(redis_url, tmp_path) as running:
        yield running
