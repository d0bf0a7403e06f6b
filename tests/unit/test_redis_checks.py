"""A Redis that may lose genfleet's state (an eviction policy, no AOF) is named at worker start and
in `genfleet status`; where CONFIG is disabled (managed Redis) INFO answers, and where neither does,
the line says it could not check."""
from __future__ import annotations

import pytest
import redis
from helpers.redis_server import RedisServer, observer
from typer.testing import CliRunner

from genfleet.cli import app as cli_app
from genfleet.common.redis_checks import durability_problems
from genfleet.status.alarms import alarms
from genfleet.status.read_model import read_status


@pytest.fixture
def redis_with(tmp_path):
    """Starts a redis-server with the given options (after the helper's noeviction); a client to it."""
    servers: list[RedisServer] = []

    def start(*options: str) -> redis.Redis:
        server = RedisServer(tmp_path / f"redis-{len(servers)}", *options)
        server.start()
        servers.append(server)
        return observer(server.url)

    yield start
    for server in servers:
        server.stop()


def test_noeviction_with_aof_is_fine_and_each_gap_is_one_line(redis_with):
    assert durability_problems(redis_with("--appendonly", "yes")) == []
    problems = durability_problems(redis_with("--appendonly", "no", "--maxmemory-policy", "allkeys-lru"))
    assert len(problems) == 2
    assert problems[0].startswith("Redis maxmemory-policy is allkeys-lru, not noeviction")
    assert problems[1].startswith("Redis runs without AOF")


def test_without_config_the_answer_comes_from_info_and_without_both_it_says_so(redis_with):
    managed = redis_with("--appendonly", "no", "--rename-command", "CONFIG", "")
    with pytest.raises(redis.ResponseError):
        managed.config_get("appendonly")
    assert [p.split(" (")[0] for p in durability_problems(managed)] == ["Redis runs without AOF"]
    locked = redis_with("--rename-command", "CONFIG", "", "--rename-command", "INFO", "")
    (line,) = durability_problems(locked)
    assert line.startswith("could not check Redis's maxmemory-policy and AOF")


def test_status_alarms_on_a_redis_without_aof(redis_with):
    client = redis_with("--appendonly", "no")
    assert any(line.startswith("Redis runs without AOF") for line in alarms(read_status(client, "r")))
    assert not any("Redis" in line for line in alarms(read_status(redis_with("--appendonly", "yes"), "r")))


def test_a_worker_warns_at_start(redis_with, monkeypatch):
    client = redis_with("--appendonly", "no")
    started = []
    monkeypatch.setattr("genfleet.workers.lifecycle.run_worker", lambda settings, loglevel: started.append(settings))
    url = "redis://{host}:{port}/0".format(**client.connection_pool.connection_kwargs)
    result = CliRunner().invoke(cli_app, ["worker", "--pool", "short", "--upstream", "http://gpu1:30000",
                                          "--redis-url", url])
    assert result.exit_code == 0 and started, result.output
    assert "WARNING genfleet: Redis runs without AOF" in result.stderr
