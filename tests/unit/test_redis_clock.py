"""Redis's clock (common/redis_clock.py) against real redis-servers, on a host whose wall clock is
shifted (time.time patched in this process; the monotonic clock untouched, as on a host whose NTP
is off): stamps follow Redis, not the host, and a lease written there is judged right anywhere."""
from __future__ import annotations

import time

import pytest
import redis
from helpers.redis_server import RedisServer

from genfleet.common.keys import LEASES
from genfleet.common.redis_clock import RedisClock, clock_for, read
from genfleet.workers.delivery import LeaseKeeper


@pytest.fixture
def shifted(monkeypatch):
    """Shift this process's wall clock by the seconds given."""
    real = time.time

    def shift(seconds: float) -> None:
        monkeypatch.setattr(time, "time", lambda: real() + seconds)

    return shift


def redis_now(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return seconds + micros / 1e6


@pytest.mark.parametrize("shift_s", [-90.0, 0.0, 90.0])
def test_the_clock_is_redis_s_whatever_the_host_s_says(redis_client, shifted, shift_s):
    shifted(shift_s)
    clock = RedisClock(redis_client)
    assert abs(clock.now() - redis_now(redis_client)) < 0.05
    assert clock.offset_s() == pytest.approx(-shift_s, abs=0.05)  # positive: this host is behind


def test_a_step_of_the_wall_clock_between_readings_changes_nothing(redis_client, shifted):
    clock = RedisClock(redis_client, resync_s=3600)
    clock.now()
    shifted(-90.0)  # NTP, or `date -s`, after the reading
    assert abs(clock.now() - redis_now(redis_client)) < 0.05


def test_a_lease_written_on_a_host_90_s_behind_expires_a_lease_from_now_on_redis_s_clock(redis_client, shifted):
    shifted(-90.0)
    keeper = LeaseKeeper(redis_client, ttl_s=60.0, heartbeat_s=15.0)
    keeper.hold("tag-1")
    assert redis_client.zscore(LEASES, "tag-1") == pytest.approx(redis_now(redis_client) + 60.0, abs=0.1)


def test_the_clock_carries_on_through_a_redis_outage_once_it_has_read_it(tmp_path):
    server = RedisServer(tmp_path / "redis")
    server.start()
    clock = RedisClock(redis.Redis.from_url(server.url, socket_timeout=1), resync_s=0.0)
    first = clock.now()
    server.kill()
    time.sleep(0.2)
    assert clock.now() == pytest.approx(first + 0.2, abs=0.1)  # the monotonic clock carried it
    with pytest.raises(redis.RedisError):  # never read: no clock to stamp a lease with
        RedisClock(redis.Redis.from_url(server.url, socket_timeout=1)).now()


def test_one_clock_per_server_and_database(redis_url):
    one, other = redis.Redis.from_url(redis_url), redis.Redis.from_url(redis_url)
    assert clock_for(one) is clock_for(other)
    assert clock_for(redis.Redis.from_url(redis_url.rsplit("/", 1)[0] + "/3")) is not clock_for(one)
    assert read(one).round_trip_s < 1.0
