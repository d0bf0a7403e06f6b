"""Redis's clock: the one clock every lease, transit list and delivery stamp is written and judged
with, whatever each host's own clock says.

A lease is written by one worker (its expiry) and judged by another (the reaper, on any host). With
each host's `time.time()` a worker 90 s behind wrote leases that looked lapsed to a punctual reaper,
which re-queued prompts still streaming (generated twice); one 90 s ahead was, once killed, covered
for 90 s more than a lease. Redis's `TIME` is the same for every host (the server's clock, read
where the command runs: redis.io/commands/time).

Reading `TIME` before every stamp would double the heartbeat's round trips, so a `RedisClock` reads
it once per `RESYNC_S` and runs on this host's monotonic clock in between: `now()` is the Redis
time of the last reading plus the monotonic seconds since. A step of the wall clock (NTP, an
operator's `date -s`) then changes nothing, and the monotonic clock's drift over `RESYNC_S` is
microseconds. Each reading is taken at the middle of its round trip (Redis read its clock
somewhere within it), so the error is at most half a round trip.

The offset of this host's wall clock from Redis's is kept too: workers warn past `WARN_OFFSET_S`
and report it in their beacon, which `status` alarms on (a skewed host's rate buckets, beacons and
timestamps in records are still off), and `doctor` checks it before a run.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import redis

log = logging.getLogger(__name__)

RESYNC_S = 30.0
# Past this a host's wall clock is worth fixing (rates, beacons and records' timestamps use it);
# leases no longer depend on it.
WARN_OFFSET_S = 1.0


@dataclass(frozen=True)
class Reading:
    """One `TIME`: Redis's clock at the middle of the round trip, this host's wall and monotonic
    clocks there, and the round trip."""

    redis_time: float
    wall: float
    monotonic: float
    round_trip_s: float

    @property
    def offset_s(self) -> float:
        """Redis's clock minus this host's: positive when this host is behind."""
        return self.redis_time - self.wall


def read(client: redis.Redis) -> Reading:
    wall_before, before = time.time(), time.monotonic()
    seconds, micros = client.time()
    after, wall_after = time.monotonic(), time.time()
    return Reading(seconds + micros / 1e6, (wall_before + wall_after) / 2, (before + after) / 2, after - before)


class RedisClock:
    """Redis's time, read once per `resync_s` and carried on by this host's monotonic clock."""

    def __init__(self, client: redis.Redis, resync_s: float = RESYNC_S) -> None:
        self.client = client
        self.resync_s = resync_s
        self._reading: Reading | None = None
        self._lock = threading.Lock()

    def now(self) -> float:
        """Redis's clock now, in seconds since the epoch. Raises redis.RedisError where it has never
        read Redis; once it has, a failed resync keeps the last reading (the monotonic clock carries
        it) rather than stamp a lease with another clock."""
        reading = self._reading
        if reading is None or time.monotonic() - reading.monotonic >= self.resync_s:
            reading = self.resync(keep_on_error=reading is not None)
        return reading.redis_time + (time.monotonic() - reading.monotonic)

    def resync(self, *, keep_on_error: bool = False) -> Reading:
        with self._lock:
            try:
                reading = read(self.client)
            except redis.RedisError:
                if keep_on_error and self._reading is not None:
                    return self._reading
                raise
            previous, self._reading = self._reading, reading
        if abs(reading.offset_s) >= WARN_OFFSET_S and (previous is None or abs(previous.offset_s) < WARN_OFFSET_S):
            log.warning("this host's clock is %.1f s %s Redis's: leases use Redis's clock, but rates, beacons and "
                        "records' timestamps use this host's; sync it (NTP)", abs(reading.offset_s),
                        "behind" if reading.offset_s > 0 else "ahead of")
        return reading

    def offset_s(self) -> float | None:
        """This host's wall clock against Redis's at the last reading (positive: behind)."""
        return self._reading.offset_s if self._reading else None


_clocks: dict[tuple, RedisClock] = {}
_clocks_lock = threading.Lock()


def clock_for(client: redis.Redis) -> RedisClock:
    """This process's clock for the Redis `client` talks to (one per server and database, shared by
    the lease heartbeat, the reaper and kombu's channels)."""
    pool = client.connection_pool
    kwargs = pool.connection_kwargs
    key = (kwargs.get("host"), kwargs.get("port"), kwargs.get("path"), kwargs.get("db", 0))
    with _clocks_lock:
        clock = _clocks.get(key)
        if clock is None:
            # Its own connection: the client it was asked for may be a kombu channel's, closed later.
            own = redis.ConnectionPool(connection_class=pool.connection_class, max_connections=2, **kwargs)
            clock = _clocks[key] = RedisClock(redis.Redis(connection_pool=own))
        return clock
