"""`--in-flight auto`'s rule (workers/admission.py) against a model server: the combined target of
several workers on one host settles where one worker's does, a host with room is filled up to the
ceiling while its tok/s rises and no further once it stops rising, a long queue lowers the target
and retractions hold it. The model server admits `admits` requests (its KV cache) and queues the
rest, as SGLang does."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from genfleet.common.fleet_stats import ServerLoad, wanted_waiting
from genfleet.common.queues import IN_FLIGHT_PER_HOST
from genfleet.workers.admission import HostAdmission, next_target, streams
from genfleet.workers.servers.sglang_info import load_from_loads

START = IN_FLIGHT_PER_HOST["short"]  # where a worker's target starts: the pool's fixed share


def reading(held: int, admits: int, *, saturates_at: int = 10_000, retracted: int = 0, refill: int = 0) -> ServerLoad:
    """`refill`: the requests the host finishes while their replacements travel to it; those its
    waiting queue does not cover leave a slot empty meanwhile."""
    waiting = max(0, held - admits)
    running = min(held, admits) - max(0, min(refill - waiting, admits - 1))
    return ServerLoad(running=running, waiting=waiting, token_usage=running / max(admits, 1),
                      retracted=retracted, gen_throughput=30.0 * min(running, saturates_at))


def settle(workers: int, admits: int, *, ceiling: int = 150, steps: int = 160, saturates_at: int = 10_000,
           start: int = START, finishing: float = 0.1, lag: int = 0, silent: int = 0,
           blank: frozenset[int] = frozenset(), pipe: int = 0) -> list[int]:
    """Each worker fills its target at once (it has prompts to spare), but above a lowered target
    its streams close only as they finish (`finishing` of them per reading); every worker moves
    its target on the same reading. `lag`: readings by which the host's tok/s trails its batch
    (SGLang's is the mean over its last log interval); `silent`: first readings that report no
    tok/s at all (SGLang's before its first log interval ends); `blank`: readings, by number, that
    report none later on (a server that restarted between two readings); `pipe`: each worker's
    streams the server does not count (sent and not yet in its queue, or finished and not closed):
    the host's finishes during a refill, which leave slots empty where its queue is shorter."""
    hosts = [HostAdmission(target=start) for _ in range(workers)]
    open_streams = [streams(start)] * workers
    now, filled = 0.0, False
    held_before: list[int] = []
    for _ in range(steps):
        held = sum(max(0, n - pipe) for n in open_streams)
        held_before.append(held)
        load = reading(held, admits, saturates_at=saturates_at, refill=pipe * workers)
        if lag:
            lagged = reading(held_before[max(0, len(held_before) - 1 - lag)], admits, saturates_at=saturates_at,
                             refill=pipe * workers)
            load = replace(load, gen_throughput=lagged.gen_throughput)
        if len(held_before) <= silent or len(held_before) - 1 in blank:
            load = replace(load, gen_throughput=0.0)
        # Once the host was full, the workers never starve it: a lowered target must not be
        # lowered again by every reading taken while the streams above it drain.
        filled = filled or load.running == admits
        assert not filled or load.running >= 0.75 * min(admits, saturates_at), (held, load)
        for i, host in enumerate(hosts):
            host.target = next_target(host, load, mine=open_streams[i], ceiling=ceiling, now=now,
                                      others=sum(open_streams) - open_streams[i])
            cap = streams(host.target)
            open_streams[i] = cap if cap >= open_streams[i] else max(cap, open_streams[i] - math.ceil(
                finishing * open_streams[i]))
        now += 2.0
    return [streams(h.target) for h in hosts]


@settings(deadline=None)
@given(admits=st.integers(20, 140), workers=st.integers(2, 4), finishing=st.sampled_from([1.0, 0.3, 0.1, 0.03]))
def test_several_workers_on_one_host_settle_where_one_worker_does(admits, workers, finishing):
    alone = sum(settle(1, admits, finishing=finishing))
    together = sum(settle(workers, admits, finishing=finishing))
    # Within 10%, or a stream per worker where that is more: each worker holds whole streams.
    assert abs(together - alone) <= max(0.1 * alone, workers), (alone, together)
    # Short but not empty: a few waiting beyond what the host admits.
    assert admits <= alone <= admits + 2 * wanted_waiting(admits)


def test_a_host_with_room_is_filled_to_the_ceiling_while_its_tok_s_rises():
    assert settle(1, admits=1000, ceiling=400) == [400]
    assert sum(settle(3, admits=2000, ceiling=400)) == 1200


@pytest.mark.parametrize(("lag", "silent"), [(1, 0), (2, 0), (1, 3), (0, 4)])
def test_a_host_with_room_is_filled_as_fast_when_its_tok_s_trails_its_batch_or_starts_at_zero(lag, silent):
    # From a low target (a host that admitted few and now has room): doubled while the KV cache is
    # under half used, 16 to 150 in four raises. Against a tok/s of 0 before the host's first log
    # interval, the first three raises looked flat and held the target for a minute.
    assert settle(1, admits=1000, ceiling=150, start=16, steps=8, lag=lag, silent=silent) == [150]
    # From the fixed share to an operator's ceiling of 400: two raises, and kept, although the
    # host's tok/s shows them only a reading or two later.
    assert settle(1, admits=1000, ceiling=400, steps=8, lag=lag, silent=silent) == [400]


@pytest.mark.parametrize("blank", [1, 2, 3, 4])
def test_a_reading_without_a_tok_s_does_not_judge_the_raises(blank):
    # From the fixed share to the ceiling: raised at readings 0 and 1, judged at reading 3. A reading
    # that reports no tok/s says nothing of them (judged by it, they looked flat: back to the
    # start, held for a minute; in CI, a host that came back stayed at 150 of the 200 it admits).
    assert settle(1, admits=1000, ceiling=400, steps=8, blank=frozenset({blank})) == [400]


@pytest.mark.parametrize("pipe", [0, 10, 30, 60])
def test_the_waiting_queue_covers_the_requests_in_the_pipe(pipe):
    # Requests sent and not yet counted are the host's finishes during a refill: the queue that
    # keeps every freed slot filled holds as many (bench/results.md, section 13's short chat: 36 in
    # the pipe, and auto's queue of 5 left 6% of the batch unfilled).
    admits = 100
    wanted = max(wanted_waiting(admits), pipe)
    target = settle(1, admits, ceiling=400, pipe=pipe)[0]
    waiting = target - pipe - admits
    assert wanted <= waiting <= 2 * wanted + 1, (target, waiting)
    # and so every slot is full
    assert reading(target - pipe, admits, refill=pipe).running == admits
    # Several workers, each with its part of the pipe, keep the same queue: each counts the others'
    # streams (their beacons), or it would take its share of the server's for its own pipe.
    for workers in (2, 3):
        together = sum(settle(workers, admits, ceiling=400, pipe=pipe // workers))
        waiting = together - pipe // workers * workers - admits
        assert wanted - workers <= waiting <= 2 * wanted + workers, (workers, together, waiting)


def test_a_raise_is_a_quarter_once_the_kv_cache_is_half_used():
    host = HostAdmission(target=100)
    roomy = ServerLoad(running=100, waiting=0, token_usage=0.3, retracted=0, gen_throughput=1000.0)
    assert next_target(host, roomy, mine=100, ceiling=400, now=0.0) == 200
    host = HostAdmission(target=100)
    assert next_target(host, replace(roomy, token_usage=0.6), mine=100, ceiling=400, now=0.0) == 125


def test_raises_that_did_not_lift_the_hosts_tok_s_go_back_to_where_they_started():
    # Past the knee (60 running) from 16: raised while tok/s rose, then back after three flat ones.
    assert 60 <= settle(1, admits=1000, ceiling=400, saturates_at=60, start=16, steps=20)[0] <= 150
    # Already past it at the fixed share: the raises to the ceiling are taken back, and held.
    assert settle(1, admits=1000, ceiling=400, saturates_at=60, steps=20) == [START]


def test_a_retraction_holds_the_target_and_a_long_queue_lowers_it_by_half_the_excess():
    # The KV ran out mid-decode: the server sheds that load itself (SGLang's new_token_ratio,
    # vLLM's preemption back to its queue). A cut below its batch would starve it; a raise only queues.
    host = HostAdmission(target=100)
    assert next_target(host, reading(100, 100, retracted=3), mine=100, ceiling=150, now=0.0) == 100
    host = HostAdmission(target=100)
    assert next_target(host, replace(reading(100, 100, retracted=3), waiting=0, token_usage=0.2),
                       mine=100, ceiling=150, now=0.0) == 100
    # With a long queue as well, the queue's rule lowers it, by the queue's excess alone.
    host = HostAdmission(target=100)
    assert next_target(host, reading(100, 60, retracted=3), mine=100, ceiling=150, now=0.0) == 81.5
    host = HostAdmission(target=100)
    # 100 held, 60 admitted: 40 waiting, 3 wanted, this worker holds all: down by half of 37.
    assert next_target(host, reading(100, 60), mine=100, ceiling=150, now=0.0) == 81.5
    # Holding half of what the server holds, it takes half the correction.
    host = HostAdmission(target=50)
    assert next_target(host, reading(100, 60), mine=50, ceiling=150, now=0.0) == 50 - 9.25
    # Between once and twice the waiting it wants: held.
    host = HostAdmission(target=64)
    assert next_target(host, reading(64, 60), mine=64, ceiling=150, now=0.0) == 64


def test_a_worker_that_does_not_fill_its_target_does_not_raise_it():
    host = HostAdmission(target=40)
    assert next_target(host, reading(10, 100), mine=10, ceiling=150, now=0.0) == 40


def test_the_target_never_leaves_one_to_the_ceiling():
    host = HostAdmission(target=1)
    assert next_target(host, reading(500, 10), mine=1, ceiling=150, now=0.0) == 1
    host = HostAdmission(target=149)
    assert next_target(host, reading(149, 1000), mine=149, ceiling=150, now=0.0) == 150


def test_loads_of_every_data_parallel_rank_are_summed():
    body = {"loads": [
        {"dp_rank": 0, "num_running_reqs": 30, "num_waiting_reqs": 4, "token_usage": 0.31, "gen_throughput": 900.5,
         "max_total_num_tokens": 200_000, "queues": {"waiting": 4, "retracted": 0}},
        {"dp_rank": 1, "num_running_reqs": 28, "num_waiting_reqs": 0, "token_usage": 0.44, "gen_throughput": 850.0,
         "max_total_num_tokens": 200_000, "queues": {"waiting": 0, "retracted": 2}},
    ]}
    load = load_from_loads(body)
    assert (load.running, load.waiting, load.retracted) == (58, 4, 2)
    assert load.token_usage == 0.44 and load.gen_throughput == 1750.5 and load.max_total_tokens == 400_000


@pytest.mark.parametrize("body", [{}, {"loads": []}, {"loads": "x"}, {"loads": ["x"]},
                                  {"loads": [{"num_running_reqs": 1}]}])
def test_an_answer_without_loads_is_refused(body):
    with pytest.raises((KeyError, ValueError)):
        load_from_loads(body)


def test_many_waiting_at_low_kv_use_is_admission_bound():
    assert ServerLoad(running=7, waiting=143, token_usage=0.11, retracted=0, gen_throughput=1.0).admission_bound()
    assert not ServerLoad(running=140, waiting=10, token_usage=0.95, retracted=0, gen_throughput=1.0).admission_bound()


def test_a_worker_with_no_stream_on_a_busy_host_keeps_its_target():
    """The server's queue is other workers' then: a newcomer is not pushed down to one stream."""
    host = HostAdmission(target=16)
    assert next_target(host, reading(200, 60), mine=0, ceiling=150, now=0.0) == 16
    assert next_target(host, reading(60, 60, retracted=4), mine=0, ceiling=150, now=0.0) == 16


def test_a_raise_is_not_taken_back_when_the_tok_s_fell_because_the_run_ran_out_of_prompts():
    # Raised on a roomy host; then the run's queue runs dry and this worker's streams finish one
    # after another, so the host's tok/s falls: that judges the work left, not the raise (bench
    # section 10 saw 400 -> 150 at the end of a run, held for a minute).
    host = HostAdmission(target=150)
    roomy = ServerLoad(running=150, waiting=0, token_usage=0.1, retracted=0, gen_throughput=4500.0)
    raised = next_target(host, roomy, mine=150, ceiling=400, now=0.0)
    host.target = raised
    for step, mine in enumerate((100, 60, 30), start=1):
        draining = replace(roomy, running=mine, gen_throughput=30.0 * mine)
        host.target = next_target(host, draining, mine=mine, ceiling=400, now=2.0 * step)
    assert (raised, host.target, host.hold_until) == (300, 300, 0.0)
