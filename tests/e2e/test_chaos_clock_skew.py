"""Chaos: a worker whose host's wall clock is 90 s off. Leases, deliveries and transit lists run on
Redis's clock (common/redis_clock.py), so a punctual worker's reaper never takes the skewed one's
running prompts (judged by the simulator's count of generations, not our counters), and a skewed
worker that dies has its prompts back within a lease and a reaper pass."""
from __future__ import annotations

import os
import time

from helpers.data import write_prompts
from helpers.paths import TESTS
from helpers.sim_process import SimProcess
from helpers.waits import wait_until
from test_chaos import QUICK, assert_every_prompt_accounted_for

from genfleet.common.keys import KOMBU_UNACKED, KOMBU_UNACKED_INDEX

SHIFT_S = 90.0
# Each completion takes ~2-3 s at 20 tok/s: many leases (3 s) and reaper passes (0.5 s) long.
SLOW = ("--rate", "20", "--knee", "100000", "--length-median", "45", "--length-mean", "46")


def skewed(shift_s: float) -> dict[str, str]:
    """The environment of a worker whose host's wall clock runs `shift_s` ahead (negative: behind)."""
    path = os.pathsep.join(filter(None, [str(TESTS / "helpers" / "wall_clock_shift"), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, "GENFLEET_TEST_WALL_CLOCK_SHIFT_S": str(shift_s)}


def test_a_worker_90_s_behind_never_loses_its_running_prompts_to_a_punctual_reaper(fleet, tmp_path):
    fleet.configure(**QUICK)
    data = write_prompts(tmp_path / "behind.jsonl", 200)
    with SimProcess(*SLOW) as sim:
        # The punctual worker's reaper judges every lease: the fleet makes one reaper pass per
        # interval, whoever takes the lock first (workers/delivery.py), so the skewed one asks rarely.
        behind = fleet.start_worker("short", sim.url, concurrency=30,
                                    env={**skewed(-SHIFT_S), "GENFLEET_REAPER_INTERVAL_S": "3600"})
        fleet.start_worker("short", sim.url, concurrency=30)
        fleet.enqueue("behind", f"b={data}")
        fleet.wait_finished("behind", timeout=150)
        generations = sim.stats()["requests_started"]
    counts = assert_every_prompt_accounted_for(fleet, "behind", {f"b/{i}" for i in range(200)})
    assert generations == 200, f"{generations - 200} prompts generated twice"
    assert counts["duplicated"] == 0
    log = behind.log.read_text()
    assert "s behind Redis's" in log  # the skewed worker said so at start
    print(f"clock 90 s behind: {generations} generations for 200 prompts; {counts}")


def test_a_worker_90_s_ahead_that_dies_has_its_prompts_back_within_a_lease(fleet, tmp_path, redis_client):
    fleet.configure(**QUICK)
    data = write_prompts(tmp_path / "ahead.jsonl", 80)
    with SimProcess(*SLOW) as sim:
        ahead = fleet.start_worker("short", sim.url, concurrency=24, env=skewed(SHIFT_S))
        fleet.enqueue("ahead", f"a={data}")
        wait_until(lambda: redis_client.hlen(KOMBU_UNACKED) >= 24, timeout=60)
        ahead.kill()
        started = time.monotonic()
        # Each held message's delivery stamp: a restore drops it, a redelivery writes a new one.
        held = {tag: redis_client.zscore(KOMBU_UNACKED_INDEX, tag) for tag in redis_client.hkeys(KOMBU_UNACKED)}
        fleet.start_worker("short", sim.url, concurrency=30)

        def reclaimed() -> bool:  # every held message re-queued (and maybe fetched again) since the kill
            return all(redis_client.zscore(KOMBU_UNACKED_INDEX, tag) != stamp for tag, stamp in held.items())

        wait_until(reclaimed, timeout=60)
        reclaim_s = time.monotonic() - started
        fleet.wait_finished("ahead", timeout=150)
    counts = assert_every_prompt_accounted_for(fleet, "ahead", {f"a/{i}" for i in range(80)})
    assert counts["dead"] == 0
    # A lease, a reaper pass and the new worker's start-up, with slack: never the 90 s of the skew.
    assert reclaim_s < QUICK["lease_ttl_s"] + QUICK["reaper_interval_s"] + 10, reclaim_s
    print(f"clock 90 s ahead, SIGKILLed holding {len(held)}: back in {reclaim_s:.1f} s; {counts}")
