"""redis-server processes of the tests' own: the session's shared one, and ones a test kills."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import redis

from helpers.sim_process import free_port
from helpers.waits import wait_until

# redis-py 8.0 gave every client a 5 s socket timeout where it had none (`redis/_defaults.py`
# DEFAULT_SOCKET_TIMEOUT, redis 8.2.0). A test's own reads watch a fleet on a busy 2-core machine
# (beside a model server, in CI): one CI run saw a read of the vLLM tier's progress go unanswered for
# 5 s and fail the test, while the workers' clients retried through it (common/run_state.connect). A
# test waits for a slow answer as long as it waits for anything; a dead server still fails it.
TEST_CLIENT_TIMEOUT_S = 60.0


def observer(url: str) -> redis.Redis:
    """The tests' own client of the Redis at `url`: the fleet's observer, never its subject."""
    return redis.Redis.from_url(url, socket_timeout=TEST_CLIENT_TIMEOUT_S,
                                socket_connect_timeout=TEST_CLIENT_TIMEOUT_S)


def pings(url: str) -> bool:
    """Whether a Redis server answers at `url` (with its password and TLS settings)."""
    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1).ping())
    except redis.RedisError:
        return False


def redis_binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed: `apt-get install redis-server` (make test does it as root)")
    return binary


class RedisServer:
    """redis-server on a free loopback port, its files in `directory`, no snapshots, no eviction;
    `options` add to that (e.g. AOF). Can be SIGKILLed and started again in place."""

    def __init__(self, directory: Path, *options: str) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.options = options
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 10.0) -> None:
        self.process = subprocess.Popen(
            [redis_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory),
             "--save", "", "--maxmemory-policy", "noeviction", *self.options],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: pings(self.url), timeout, 0.05, "redis-server did not start")
        except AssertionError:
            self.kill()
            raise

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
