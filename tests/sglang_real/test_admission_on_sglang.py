"""`--in-flight auto` on SGLang's own scheduler: a server that admits 20 requests at once
(`--max-running-requests 20`) queues the rest (0.5.23 `managers/scheduler.py`, its waiting queue),
and reports both in `/v1/loads`. From the fixed share, one worker's target settles just above what
it admits; two workers on the same server settle at a combined target within ±10% of one worker's;
a server that goes away (SIGKILL) and comes back on its port is steered again from the start."""
from __future__ import annotations

import time

import pytest
from helpers.waits import wait_until
from server import RealServer
from tier import enqueue, write_plan_prompts

from genfleet.common.fleet_stats import read_beacons, wanted_waiting
from genfleet.common.queues import IN_FLIGHT_PER_HOST

ADMITS = 20
CEILING = 80
START = min(IN_FLIGHT_PER_HOST["short"], CEILING)  # where a target starts
# Requests of a second or two, and enough of them to keep every worker full for the whole test: a
# lowered target closes no stream, it takes effect as streams finish.
PLAN = "[plan len=300]"
PROMPTS = 4000
QUICK = dict(in_flight_mode="auto", admission_interval_s=0.5, health_interval_s=1, breaker_open_s=2, shutdown_grace_s=1,
             retry_backoff_s=0.1, retry_backoff_max_s=0.5)


def targets(fleet, url: str) -> list[int]:
    return [u.target for b in read_beacons(fleet.redis) for u in b.upstreams if u.url == url and u.target]


def pipe(fleet, url: str) -> int:
    """The workers' streams to the server that its counts do not hold (sent and not yet received by
    its scheduler, or finished and not yet closed), as the beacons show them: the queue auto keeps
    covers them (workers/admission.py `in_transit`)."""
    upstreams = [u for b in read_beacons(fleet.redis) for u in b.upstreams if u.url == url]
    load = next((u.load for u in upstreams if u.load is not None), None)
    return max(0, sum(u.in_flight for u in upstreams) - load.running - load.waiting) if load else 0


def settled_sum(fleet, url: str, workers: int, seconds: float = 12.0) -> tuple[float, int]:
    """The workers' summed target, averaged over `seconds`, and the most seen in the pipe then."""
    wait_until(lambda: len(targets(fleet, url)) == workers, 60, 0.25, f"{workers} workers' targets")
    time.sleep(12.0)  # down from the start, as streams finish
    sums, pipes = [], []
    for _ in range(int(seconds / 0.5)):
        sums.append(sum(targets(fleet, url)))
        pipes.append(pipe(fleet, url))
        time.sleep(0.5)
    return sum(sums) / len(sums), max(pipes)


def band(in_pipe: int) -> int:
    """The most a settled target may be: what the server admits, the pipe, and a queue of at most
    twice the wanted one (a few, or the pipe)."""
    return ADMITS + in_pipe + 2 * max(wanted_waiting(ADMITS), in_pipe) + 1


@pytest.mark.kills_a_server
@pytest.mark.timeout(600)
def test_workers_on_a_real_server_settle_on_what_it_admits_and_ramp_up_again_after_it_comes_back(
        venv, model, real_fleet, tmp_path):
    server = RealServer(venv, model, "--max-running-requests", str(ADMITS), name="admits").start()
    try:
        real_fleet.configure(**QUICK)
        data = write_plan_prompts(tmp_path / "a.jsonl", PROMPTS, (PLAN,), stem="admission")
        real_fleet.start_worker("short", server.url, concurrency=CEILING)
        enqueue(real_fleet, model, "adm", f"a={data}", extra=("--max-new-tokens", "400"))
        alone, alone_pipe = settled_sum(real_fleet, server.url, 1)
        # Short but not empty: the server full, a few waiting (a reading may fall between one
        # request's end and the next one's admission).
        wait_until(lambda: (load := server.load())["num_running_reqs"] == ADMITS and load["num_waiting_reqs"] > 0,
                   10, 0.1, "the server full with a few waiting")
        real_fleet.start_worker("short", server.url, concurrency=CEILING)
        together, _ = settled_sum(real_fleet, server.url, 2)

        server.kill()
        wait_until(lambda: targets(real_fleet, server.url) == [START, START], 60, 0.25, "both back at the start")
        server.spawn(same_port=True).wait_healthy()
        wait_until(lambda: ADMITS - 2 <= sum(targets(real_fleet, server.url)) <= band(pipe(real_fleet, server.url)) + 1,
                   90, 0.25, "settled again after the restart")
    finally:
        server.stop()
    assert ADMITS <= alone <= band(alone_pipe), (alone, alone_pipe)
    assert abs(together - alone) <= 0.1 * alone, (alone, together)
