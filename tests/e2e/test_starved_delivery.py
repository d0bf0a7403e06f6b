"""A worker starved (stopped: SIGSTOP, as a host that gets no CPU) past its lease at the two points
of a delivery before its lease keeper holds the message: on its transit list after the BLMOVE, and
in kombu's `unacked` before the lease keeper's `hold`. Another worker's reaper rightly hands the
message to its own worker meanwhile; the starved worker, woken, must not generate it a second time.
Judged by the simulator's count of generations.

The stop is the worker's own (tests/helpers/stop_at/sitecustomize.py: it stops itself once, at the
point), so the window is hit every run rather than 1 run in 6 under load."""
from __future__ import annotations

import signal

import pytest
from helpers.data import write_prompts
from helpers.paths import TESTS
from helpers.sim_process import SimProcess
from helpers.waits import wait_until

LEASE = dict(lease_ttl_s=3, lease_heartbeat_s=0.5, reaper_interval_s=0.5, retry_backoff_s=0.2,
             retry_backoff_max_s=2, stall_timeout_s=30, breaker_open_s=1, health_interval_s=0.5)
# ~8 s completions (40 tokens at 5 tokens/s): the second worker still streams when the first wakes.
EIGHT_SECONDS = ("--rate", "5", "--knee", "100000", "--length-median", "40", "--length-mean", "41")


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.parametrize("point", ["transit", "received"])
def test_a_worker_starved_before_it_holds_a_message_never_generates_it_twice(fleet, tmp_path, point):
    fleet.configure(**LEASE)
    data = write_prompts(tmp_path / "p.jsonl", 1)
    mark = tmp_path / "stopped"
    env = {"PYTHONPATH": str(TESTS / "helpers" / "stop_at"), "GENFLEET_TEST_STOP_AT": point,
           "GENFLEET_TEST_STOP_MARK": str(mark)}
    with SimProcess(*EIGHT_SECONDS) as sim:
        starved = fleet.start_worker("short", sim.url, concurrency=1, env=env)
        fleet.enqueue("starved", f"p={data}")
        wait_until(lambda: mark.exists() and _state(starved.process.pid) == "T", timeout=60,
                   message=f"the worker never stopped at {point}")
        try:
            # Its lease (or its transit list) lapses; this worker's reaper gives the message to itself.
            fleet.start_worker("short", sim.url, concurrency=2)
            wait_until(lambda: sim.stats()["running"] == 1, timeout=60,
                       message="the message never reached the second worker")
        finally:
            starved.process.send_signal(signal.SIGCONT)
        # The woken worker either generates the prompt again (the bug) or stops its copy.
        wait_until(lambda: sim.stats()["requests_started"] > 1 or "this copy stops" in starved.log.read_text(),
                   timeout=60, message="the woken worker did neither")
        fleet.wait_finished("starved", timeout=120)
        generations = sim.stats()["requests_started"]
    assert generations == 1, f"starved at {point}: the prompt was generated {generations} times"
    assert [r["id"] for r in fleet.records("starved")] == ["p/0"]
