"""Chaos: Redis shut down and started again, twice, while three workers hold 150 streams. No worker
exits (kombu 5.7.0 used to crash every worker that held a message: `workers/broker.py`), every
stream finishes, nothing is handed to a second worker while it runs, no record is written twice, and
nothing is lost or dead-lettered.

Redis keeps its data across the restarts (AOF, as deployed); `stop()` is a graceful shutdown, as
`redis-cli shutdown`, so the AOF is complete."""
from __future__ import annotations

import time
from collections import Counter

from helpers.data import write_prompts
from helpers.fleet import Fleet
from helpers.redis_server import RedisServer
from helpers.sim_process import SimProcess
from helpers.waits import wait_until

from genfleet.common.keys import KOMBU_UNACKED
from genfleet.common.run_state import RunState

WORKERS, STREAMS = 3, 50
PROMPTS = WORKERS * STREAMS
# ~40-60 tokens at 4 tokens/s: every stream outlives both restarts. One request in ten fails at once
# (HTTP 500): its retry waits out a countdown in a worker's timer, holding its message but not running,
# which is what Celery forgets when its connection drops.
SLOW = ("--rate", "4", "--knee", "100000", "--length-median", "50", "--length-mean", "51",
        "--http-500-rate", "0.1", "--fault-seed", "7")
# Leases longer than an outage plus a worker's reconnect backoff (the reaper judges none within a lease
# of Redis coming back), everything else quick.
SETTINGS = dict(lease_ttl_s=10, lease_heartbeat_s=0.5, reaper_interval_s=0.5, retry_backoff_s=3,
                retry_backoff_max_s=6, max_attempts=8, stall_timeout_s=60, breaker_open_s=1,
                health_interval_s=0.5)
OUTAGE_S = 3.0


def restart(server: RedisServer, fleet: Fleet) -> int:
    """Shuts Redis down with every message held, starts it again on the same port and files; returns
    how many messages were held at the shutdown."""
    held = fleet.redis.hlen(KOMBU_UNACKED)
    server.stop()
    time.sleep(OUTAGE_S)
    server.start()
    return held


def test_two_redis_restarts_with_150_streams_in_flight_cost_nothing(tmp_path):
    server = RedisServer(tmp_path / "redis", "--appendonly", "yes", "--appendfsync", "everysec")
    server.start()
    try:
        with Fleet(server.url, tmp_path, **SETTINGS) as fleet, SimProcess(*SLOW) as sim:
            data = write_prompts(tmp_path / "r.jsonl", PROMPTS)
            workers = [fleet.start_worker("short", sim.url, concurrency=STREAMS) for _ in range(WORKERS)]
            fleet.enqueue("restart", f"r={data}")
            wait_until(lambda: fleet.redis.hlen(KOMBU_UNACKED) == PROMPTS, timeout=60,
                       message="150 streams in flight")
            held = [restart(server, fleet)]
            time.sleep(3)  # the workers reconnect; their streams go on
            held.append(restart(server, fleet))
            progress = fleet.wait_finished("restart", timeout=240)
            time.sleep(1)
            exits = [w.tail() for w in workers if w.process.poll() is not None]
            records = Counter(record["id"] for record in fleet.records("restart"))
            dead = RunState(fleet.redis, "restart").dead_letters()
            logs = "\n".join(w.log.read_text(errors="replace") for w in workers)
    finally:
        server.kill()
    counts = {"in": PROMPTS, "done": len(records), "dead": len(dead),
              "duplicated": sum(records.values()) - len(records), "worker exits": len(exits),
              "held at each restart": held}
    print(f"redis restarted twice: {counts}")
    assert not exits, f"a worker exited:\n{exits[0]}"
    assert "Unrecoverable error" not in logs
    assert held[0] == PROMPTS and held[1] > 0, "the restarts must catch streams in flight"
    assert progress.totals().done == PROMPTS and set(records) == {f"r/{i}" for i in range(PROMPTS)}
    assert counts["dead"] == 0 and counts["duplicated"] == 0
