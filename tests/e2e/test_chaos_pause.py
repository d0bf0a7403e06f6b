"""Chaos: a worker paused past its lease (a GC or VM pause, SIGSTOP) while it streams. Another
worker's reaper re-queues its messages; the paused worker, woken, takes them back from the queue
while its first copies still stream. It must never run one prompt twice at once: the first copy of
each message delivered again stops (freeing its server slot), the new one starts after it."""
from __future__ import annotations

import signal
from collections import Counter

from helpers.data import write_prompts
from helpers.fleet import Fleet, same_worker_overlaps
from helpers.sim_process import SimProcess
from helpers.waits import wait_until

from genfleet.common.keys import KOMBU_UNACKED

LEASE = dict(lease_ttl_s=3, lease_heartbeat_s=0.5, reaper_interval_s=0.5, retry_backoff_s=0.2,
             retry_backoff_max_s=2, stall_timeout_s=30, breaker_open_s=1, health_interval_s=0.5)
# ~8 s completions (40 tokens at 5 tokens/s): a pause of two leases leaves each first copy streaming.
EIGHT_SECONDS = ("--rate", "5", "--knee", "100000", "--length-median", "40", "--length-mean", "41")
STREAMS = 6


def test_a_worker_paused_past_its_lease_never_runs_a_prompt_twice_at_once(fleet: Fleet, tmp_path):
    fleet.configure(**LEASE)
    data = write_prompts(tmp_path / "p.jsonl", STREAMS)
    with SimProcess(*EIGHT_SECONDS) as sim:
        victim = fleet.start_worker("short", sim.url, concurrency=STREAMS)
        fleet.start_worker("long", sim.url, concurrency=2)  # idle: its reaper judges the victim's leases
        fleet.enqueue("pause", f"p={data}")
        wait_until(lambda: fleet.redis.hlen(KOMBU_UNACKED) == STREAMS and sim.stats()["running"] == STREAMS,
                   timeout=60, message="the victim never held every stream")
        held = {tag.decode() for tag in fleet.redis.hkeys(KOMBU_UNACKED)}
        victim.process.send_signal(signal.SIGSTOP)
        try:
            # Past its lease: the other worker's reaper puts every message back on the queue.
            wait_until(lambda: fleet.redis.llen("short") == STREAMS, timeout=30,
                       message="the reaper did not re-queue the paused worker's messages")
        finally:
            victim.process.send_signal(signal.SIGCONT)
        fleet.wait_finished("pause", timeout=120)
        # And every copy of every message has ended: a second copy still streaming would write later.
        wait_until(lambda: fleet.redis.hlen(KOMBU_UNACKED) == 0 and sim.stats()["running"] == 0, timeout=60,
                   message="copies still running after the run finished")
    records = fleet.records("pause")
    assert Counter(r["id"] for r in records) == {f"p/{i}": 1 for i in range(STREAMS)}, "a prompt generated twice"
    assert same_worker_overlaps(records) == [], "the woken worker ran a prompt twice at once"
    assert "delivered to this worker again" in victim.log.read_text(), "no message came back to the victim"
    assert held  # the messages the victim held were the ones re-queued
