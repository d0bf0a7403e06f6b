"""Worker beacons: every few seconds each worker publishes, with a short TTL, what only it knows:
the health of its upstreams (circuit open or closed) and its tasks in flight per run, dataset and
partition. `genfleet status` reads the live ones; a dead worker's beacon simply expires.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

import redis

from genfleet.common.keys import WORKER_BEACONS, worker_beacon

# Often enough that `status` shows in-flight counts close to the counters it reads fresh: one small
# SET per worker every 2 s is nothing for Redis even at a hundred workers.
BEACON_INTERVAL_S = 2.0
BEACON_TTL_S = 10.0
# Names of workers silent this long are dropped from the index (their beacon expired long ago).
_FORGET_AFTER_S = 86400.0


@dataclass(frozen=True)
class UpstreamHealth:
    url: str
    healthy: bool  # circuit closed: the worker sends it traffic
    in_flight: int


@dataclass(frozen=True)
class WorkerBeacon:
    name: str
    pool: str
    slots: int
    time: float
    upstreams: list[UpstreamHealth] = field(default_factory=list)
    # run -> "partition:dataset" -> tasks executing now
    in_flight: dict[str, dict[str, int]] = field(default_factory=dict)
    # Why this worker cannot write its shards now (disk full, write errors), or None.
    disk_problem: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: bytes | str) -> WorkerBeacon:
        raw = json.loads(text)
        raw["upstreams"] = [UpstreamHealth(**u) for u in raw.get("upstreams", [])]
        return cls(**raw)

    def run_in_flight(self, run: str) -> dict[tuple[str, str], int]:
        """(dataset, partition) -> tasks of `run` executing on this worker."""
        out = {}
        for key, count in self.in_flight.get(run, {}).items():
            partition, _, dataset = key.partition(":")
            out[(dataset, partition)] = count
        return out


def publish(client: redis.Redis, beacon: WorkerBeacon, ttl_s: float = BEACON_TTL_S) -> None:
    pipe = client.pipeline(transaction=False)
    pipe.set(worker_beacon(beacon.name), beacon.to_json(), px=int(ttl_s * 1000))
    pipe.zadd(WORKER_BEACONS, {beacon.name: beacon.time})
    pipe.execute()


def withdraw(client: redis.Redis, name: str) -> None:
    """On a clean shutdown: the worker stops counting as live at once."""
    pipe = client.pipeline(transaction=False)
    pipe.delete(worker_beacon(name))
    pipe.zrem(WORKER_BEACONS, name)
    pipe.execute()


def read_beacons(client: redis.Redis, now: float | None = None) -> list[WorkerBeacon]:
    now = time.time() if now is None else now
    client.zremrangebyscore(WORKER_BEACONS, 0, now - _FORGET_AFTER_S)
    names = [n.decode() if isinstance(n, bytes) else n
             for n in client.zrangebyscore(WORKER_BEACONS, now - BEACON_TTL_S, "+inf")]
    if not names:
        return []
    raw = client.mget([worker_beacon(name) for name in names])
    return sorted((WorkerBeacon.from_json(text) for text in raw if text), key=lambda b: b.name)
