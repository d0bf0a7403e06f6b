"""`UpstreamPool` on its own: routing to the least busy healthy host, away from the one that just
failed, within the per-host cap; the circuit breaker that opens after consecutive failures and
closes again when a health probe (the SGLang seam's `/health`, on a stub server in this process) passes."""
from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest
from helpers.http_stub import http_stub, status_handler
from helpers.sim_process import free_port
from helpers.waits import wait_until

from genfleet.workers.errors import NoFreeSlot, NoUpstreamError, ShutdownRequested
from genfleet.workers.upstreams import UpstreamPool

A, B, C = "http://a", "http://b", "http://c"


def always_healthy(url: str) -> bool:
    """The health probe of a pool whose test never probes it."""
    return True


@pytest.fixture
def health_probe(sglang_server) -> Callable[[str], bool]:
    """The probe a worker builds its pool with (workers/runtime.py): the server seam's `GET /health`."""
    return lambda url: sglang_server.health(url, timeout_s=5).ready


class Slots:
    """Leases taken from a pool and kept until given back (a dropped lease would end at once)."""

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.held: list[AbstractContextManager[str]] = []

    def take(self, **lease: object) -> str:
        """A slot on the host the pool picks; returns that host."""
        slot = self.pool.lease(**lease)
        url = slot.__enter__()
        self.held.append(slot)
        return url

    def give_back(self, index: int) -> None:
        self.held[index].__exit__(None, None, None)


def test_each_lease_goes_to_the_host_with_the_fewest_in_flight():
    slots = Slots(UpstreamPool([A, B, C], per_upstream_cap=10, healthy=always_healthy))
    assert [slots.take() for _ in range(6)] == [A, B, C, A, B, C]
    slots.give_back(1)  # one of B's requests ends
    assert slots.pool.in_flight() == {A: 2, B: 1, C: 2}
    assert slots.take() == B


def test_a_retry_avoids_the_host_that_failed_unless_no_other_has_a_free_slot():
    slots = Slots(UpstreamPool([A, B], per_upstream_cap=1, healthy=always_healthy))
    assert slots.take(avoid=A) == B  # A is idle, but it just failed this prompt
    assert slots.take(avoid=A) == A  # B is full: A is better than waiting


def test_no_host_takes_more_than_its_cap_and_a_waiting_lease_gets_the_next_free_slot():
    slots = Slots(UpstreamPool([A], per_upstream_cap=2, healthy=always_healthy))
    slots.take()
    slots.take()
    # Healthy but full for the whole wait: this worker's own caps, not the prompt's fault (the task
    # gives its message back, no attempt counted: workers/failures.py).
    with pytest.raises(NoFreeSlot, match="2 in flight") as waited:
        slots.take(wait_s=0.2)
    assert waited.value.healthy
    got: list[str] = []
    waiter = threading.Thread(target=lambda: got.append(slots.take(wait_s=10)))
    waiter.start()
    slots.give_back(0)
    waiter.join(timeout=5)
    assert got == [A] and slots.pool.in_flight() == {A: 2}


def test_a_lease_waiting_for_a_slot_gives_way_to_a_shutdown():
    slots = Slots(UpstreamPool([A], per_upstream_cap=1, healthy=always_healthy))
    slots.take()
    with pytest.raises(ShutdownRequested):
        slots.take(wait_s=10, should_stop=lambda: True)


def test_the_circuit_opens_after_consecutive_failures_only():
    pool = UpstreamPool([A, B], per_upstream_cap=10, healthy=always_healthy, failure_threshold=3, open_s=30)
    for ok in (False, False, True, False, False):  # a success resets the count
        pool.report(A, ok=ok)
    assert pool.healthy() == [A, B]
    pool.report(A, ok=False)
    assert pool.healthy() == [B]
    slots = Slots(pool)
    assert [slots.take(), slots.take()] == [B, B], "an open circuit gets no traffic, however idle its host"


def test_with_every_circuit_open_a_lease_waits_then_fails_naming_the_hosts_down():
    pool = UpstreamPool([A], per_upstream_cap=10, healthy=always_healthy, failure_threshold=1, open_s=30)
    pool.report(A, ok=False)
    with pytest.raises(NoFreeSlot, match=r"http://a \(down\)") as waited:
        Slots(pool).take(wait_s=0.2)
    assert not waited.value.healthy


def test_a_probe_closes_an_open_circuit_once_its_cool_down_is_over_and_health_answers_200(health_probe):
    status, probes = [200], []

    def health() -> int:
        probes.append(1)
        return status[0]

    with http_stub(get=status_handler(health)) as url:
        pool = UpstreamPool([url], per_upstream_cap=4, healthy=health_probe, failure_threshold=1, open_s=30)
        recovered: list[str] = []
        pool.on_recovered = recovered.append
        pool.report(url, ok=False)
        pool.probe_once()
        assert (pool.healthy(), probes) == ([], []), "probed during its cool-down"
        pool.open_s = 0
        pool.states[url].open_until = 1e-9  # cool-down over
        status[0] = 503
        pool.probe_once()
        assert pool.healthy() == [] and probes == [1]
        pool.states[url].open_until = 1e-9
        status[0] = 200
        pool.probe_once()
    assert pool.healthy() == [url] and recovered == [url]
    assert pool.states[url].consecutive_failures == 0


def test_a_probe_opens_the_circuit_of_a_host_that_is_down_before_traffic_goes_to_it(health_probe):
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with http_stub(get=status_handler(lambda: 503)) as unhealthy, http_stub(get=status_handler(lambda: 200)) as up:
        pool = UpstreamPool([dead, unhealthy, up], per_upstream_cap=4, healthy=health_probe)
        pool.probe_once()
        assert pool.healthy() == [up]
        assert Slots(pool).take() == up


def test_the_probe_thread_brings_a_recovered_host_back_by_itself(health_probe):
    with http_stub(get=status_handler(lambda: 200)) as url:
        pool = UpstreamPool([url], per_upstream_cap=4, healthy=health_probe, failure_threshold=1, open_s=0.05,
                            probe_interval_s=0.05)
        pool.report(url, ok=False)
        assert pool.healthy() == []
        pool.start_probes()
        try:
            wait_until(lambda: pool.healthy() == [url], timeout=10, interval=0.05,
                       message="the circuit never closed")
        finally:
            pool.stop_probes()


def test_the_probe_thread_outlives_a_probe_that_raises():
    """At shutdown the worker closes the client the probe uses while a probe may be running: the
    probe raises, and the thread must go on probing (and stop when told), not die."""
    calls: list[str] = []

    def probe(url: str) -> bool:
        calls.append(url)
        if len(calls) == 1:
            raise RuntimeError("Cannot send a request, as the client has been closed.")
        return True

    pool = UpstreamPool([A], per_upstream_cap=4, healthy=probe, probe_interval_s=0.02)
    pool.start_probes()
    try:
        wait_until(lambda: len(calls) >= 3, timeout=10, interval=0.02, message="the prober stopped probing")
    finally:
        pool.stop_probes()


def test_urls_are_normalised_and_a_pool_needs_at_least_one():
    assert UpstreamPool([A + "/", B], per_upstream_cap=1, healthy=always_healthy).urls == [A, B]
    with pytest.raises(NoUpstreamError, match="--upstream"):
        UpstreamPool([], per_upstream_cap=1, healthy=always_healthy)
