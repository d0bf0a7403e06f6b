"""Chaos: a worker killed after taking a message off its queue and before recording it as unacked.
With kombu's BRPOP that message was gone until an operator ran `enqueue --recover-lost` on a drained
fleet; a genfleet worker takes it onto its transit list instead (`workers/broker.py`), and the
surviving workers' reaper puts it back on the queue unaided, within a lease. A message that is gone
for good (dropped by hand, a Redis without AOF) cannot come back by itself: the workers' check finds
its prompt and `genfleet status` names it, with the fix."""
from __future__ import annotations

import json
import subprocess
import sys
import time

from helpers.data import write_prompts
from helpers.sim_process import ONE_SECOND, SimProcess
from helpers.waits import wait_until

from genfleet.common.keys import KOMBU_UNACKED, TRANSITS
from genfleet.common.queues import SHORT
from genfleet.common.run_state import RunState

QUICK = dict(lease_ttl_s=3, lease_heartbeat_s=0.5, reaper_interval_s=0.5, retry_backoff_s=0.2,
             retry_backoff_max_s=2, stall_timeout_s=5, breaker_open_s=1, health_interval_s=0.5)

# A worker's consumer (genfleet's Celery app and transport), SIGKILLed right after its blocking pop
# returned a message and before kombu records it as unacked (`QoS.append`).
KILLED_IN_THE_WINDOW = """
import os
from kombu import Consumer
from genfleet.common.queues import QUEUES, SHORT
from genfleet.common.settings import Settings
from genfleet.workers import broker
from genfleet.workers.lifecycle import create_app

broker.QoS.append = lambda *_: os.kill(os.getpid(), 9)
with create_app(Settings()).connection_for_read() as connection:
    Consumer(connection.default_channel, queues=[q for q in QUEUES if q.name == SHORT],
             callbacks=[lambda *_: None], accept=["msgpack"]).consume()
    while True:
        connection.drain_events(timeout=30)
"""


def test_a_message_taken_by_a_worker_killed_before_recording_it_comes_back_unaided(fleet, tmp_path, redis_client):
    fleet.configure(**QUICK)
    data = write_prompts(tmp_path / "w.jsonl", 20)
    fleet.enqueue("window", f"w={data}")
    killed = subprocess.run([sys.executable, "-c", KILLED_IN_THE_WINDOW], env=fleet.env, cwd=fleet.workdir,
                            capture_output=True, text=True, timeout=60)
    killed_at = time.time()
    assert killed.returncode == -9, killed.stderr
    [transit] = redis_client.zrange(TRANSITS, 0, -1)
    assert redis_client.llen(SHORT) == 19 and redis_client.hlen(KOMBU_UNACKED) == 0
    assert redis_client.llen(transit) == 1, "kombu's BRPOP would have left it nowhere"

    with SimProcess(*ONE_SECOND) as sim:
        fleet.start_worker("short", sim.url, concurrency=10)
        wait_until(lambda: not redis_client.exists(transit), timeout=60, message="the transit list was not returned")
        back_s = time.time() - killed_at
        fleet.wait_finished("window", timeout=90)
    records = fleet.record_counts("window")
    counts = {"in": 20, "done": len(records), "dead": len(RunState(redis_client, "window").dead_letters()),
              "duplicated": sum(records.values()) - len(records)}
    print(f"killed between the pop and unacked: back on the queue after {back_s:.1f} s; {counts}")
    assert set(records) == {f"w/{i}" for i in range(20)} and counts["duplicated"] == 0 and counts["dead"] == 0
    assert back_s < QUICK["lease_ttl_s"] + 30  # a lease, a reaper pass, a worker's start-up
    assert not redis_client.zrange(TRANSITS, 0, -1) or all(
        redis_client.llen(key) == 0 for key in redis_client.zrange(TRANSITS, 0, -1))


def test_a_message_gone_for_good_is_shown_by_status_and_recover_lost_brings_it_back(fleet, tmp_path, redis_client):
    fleet.configure(**QUICK, unaccounted_check_interval_s=1)
    data = write_prompts(tmp_path / "l.jsonl", 10)
    fleet.enqueue("gone", f"l={data}")
    redis_client.rpop(SHORT)  # dropped: no copy anywhere
    with SimProcess(*ONE_SECOND) as sim:
        fleet.start_worker("short", sim.url, concurrency=10)
        wait_until(lambda: RunState(redis_client, "gone").unaccounted() == {"l": 1}, timeout=60,
                   message="the lost prompt was not found")
        found_s = time.time()
        status = json.loads(fleet.genfleet("status", "--run", "gone", "--json").stdout)
        assert status["unaccounted"] == {"l": 1}
        assert any(line.startswith("lost: 1 prompts are neither queued, running, done, dead, rejected nor skipped")
                   for line in status["alarms"]), status["alarms"]
        assert "--recover-lost" in fleet.genfleet("status", "--run", "gone").stdout

        fleet.enqueue("gone", f"l={data}", extra=("--recover-lost",))
        fleet.wait_finished("gone", timeout=60)
        wait_until(lambda: RunState(redis_client, "gone").unaccounted() == {}, timeout=30)
    records = fleet.record_counts("gone")
    counts = {"in": 10, "done": len(records), "dead": len(RunState(redis_client, "gone").dead_letters()),
              "duplicated": sum(records.values()) - len(records)}
    print(f"message dropped for good: reported by status, recovered by recover-lost; {counts}")
    assert set(records) == {f"l/{i}" for i in range(10)} and counts["duplicated"] == 0
    assert time.time() - found_s < 120
