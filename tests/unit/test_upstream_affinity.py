"""Prefix-cache-aware routing in `UpstreamPool`: a key always prefers the same healthy host
(rendezvous hashing), keys spread over the hosts, a host past the load bound spills to the least
busy, a host going down moves only its own keys, and a freed slot goes first to a request that
prefers its host."""
from __future__ import annotations

import threading
import time
from collections import Counter

from helpers.waits import wait_until
from test_upstreams import Slots, always_healthy

from genfleet.workers.upstreams import LOAD_FACTOR, SPILL_GRACE_S, UpstreamPool

HOSTS = [f"http://h{i}" for i in range(4)]


def preferred(pool: UpstreamPool, key: bytes) -> str:
    with pool.lease(affinity=key) as url:
        return url


def test_a_key_always_goes_to_the_same_host_and_keys_spread_over_all():
    pool = UpstreamPool(HOSTS, per_upstream_cap=10, healthy=always_healthy)
    keys = [f"prompt {i}".encode() for i in range(4000)]
    first = {key: preferred(pool, key) for key in keys}
    assert all(preferred(pool, key) == host for key, host in list(first.items())[:200])
    spread = Counter(first.values())
    assert set(spread) == set(HOSTS) and min(spread.values()) > 4000 / 4 * 0.85


def test_a_host_going_down_moves_only_its_own_keys():
    pool = UpstreamPool(HOSTS, per_upstream_cap=10, healthy=always_healthy)
    keys = [f"prompt {i}".encode() for i in range(2000)]
    before = {key: preferred(pool, key) for key in keys}
    for _ in range(pool.failure_threshold):
        pool.report(HOSTS[0], ok=False)
    after = {key: preferred(pool, key) for key in keys}
    moved = {key for key in keys if before[key] != after[key]}
    assert moved == {key for key in keys if before[key] == HOSTS[0]}


def test_a_preferred_host_past_the_load_bound_spills_to_the_least_busy():
    pool = UpstreamPool(HOSTS, per_upstream_cap=100, healthy=always_healthy)
    slots = Slots(pool)
    key = b"a shared system prompt"
    home = preferred(pool, key)
    taken = [slots.take(affinity=key) for _ in range(40)]
    # The home host took its share (up to LOAD_FACTOR x the mean), the rest went elsewhere.
    in_flight = pool.in_flight()
    assert taken[0] == home and in_flight[home] <= LOAD_FACTOR * (40 / 4) + 1
    assert max(in_flight.values()) - min(in_flight.values()) <= LOAD_FACTOR * 10
    assert in_flight[home] == max(in_flight.values())


def test_least_busy_routing_ignores_the_key():
    slots = Slots(UpstreamPool(HOSTS, per_upstream_cap=10, healthy=always_healthy, routing="least-busy"))
    assert sorted(slots.take(affinity=b"same") for _ in range(4)) == sorted(HOSTS)


def test_a_freed_slot_goes_first_to_a_waiting_request_that_prefers_its_host():
    pool = UpstreamPool(HOSTS[:2], per_upstream_cap=1, healthy=always_healthy)
    slots = Slots(pool)
    keys = {preferred(pool, f"k{i}".encode()): f"k{i}".encode() for i in range(20)}
    slots.take(affinity=keys[HOSTS[0]])
    slots.take(affinity=keys[HOSTS[1]])
    got: dict[str, str] = {}

    def wait_for(name: str, key: bytes) -> None:
        with pool.lease(affinity=key) as url:
            got[name] = url
            time.sleep(0.5)

    # Both wait; the one preferring h1 is first in line, yet h0's freed slot goes to h0's fan.
    threads = [threading.Thread(target=wait_for, args=(name, keys[host])) for name, host in
               (("fan of h1", HOSTS[1]), ("fan of h0", HOSTS[0]))]
    for count, thread in enumerate(threads, 1):
        thread.start()
        wait_until(lambda count=count: waiting(pool) == count, timeout=5)  # in line, in this order
    slots.give_back(0)
    wait_until(lambda: "fan of h0" in got, timeout=2)
    assert got["fan of h0"] == HOSTS[0] and "fan of h1" not in got
    slots.give_back(1)
    for thread in threads:
        thread.join(timeout=3)
    assert got["fan of h1"] == HOSTS[1]


def test_a_freed_slot_nobody_prefers_is_taken_after_the_grace():
    pool = UpstreamPool(HOSTS[:2], per_upstream_cap=1, healthy=always_healthy)
    slots = Slots(pool)
    keys = {preferred(pool, f"k{i}".encode()): f"k{i}".encode() for i in range(20)}
    slots.take(affinity=keys[HOSTS[0]])
    slots.take(affinity=keys[HOSTS[1]])
    took: list[tuple[str, float]] = []

    def wait() -> None:
        with pool.lease(affinity=keys[HOSTS[1]]) as url:
            took.append((url, time.monotonic()))

    thread = threading.Thread(target=wait)
    thread.start()
    wait_until(lambda: waiting(pool) == 1, timeout=5)
    released_at = time.monotonic()
    slots.give_back(0)  # h0 frees; the waiter prefers h1, which stays full
    thread.join(timeout=2)
    (url, at), = took
    assert url == HOSTS[0] and SPILL_GRACE_S * 0.8 <= at - released_at < SPILL_GRACE_S + 0.5


def test_a_prompt_warm_on_its_host_goes_there_past_the_load_bound():
    """A sample after the first finds its prompt in its host's cache: balance is not worth a full
    prefill elsewhere (the cap still holds)."""
    pool = UpstreamPool(HOSTS, per_upstream_cap=100, healthy=always_healthy)
    slots = Slots(pool)
    key = b"leading tokens of one prompt"
    home = slots.take(affinity=key, prompt=b"run\0d/1")
    taken = [slots.take(affinity=key, prompt=b"run\0d/1") for _ in range(19)]
    assert set(taken) == {home} and pool.in_flight()[home] == 20  # far past 1.25 x the mean
    other = slots.take(affinity=key, prompt=b"run\0d/2")  # another prompt, same leading tokens
    assert other != home


def test_a_full_host_keeps_a_warm_prompt_waiting_longer_before_it_spills(monkeypatch):
    monkeypatch.setattr("genfleet.workers.upstreams.WARM_SPILL_GRACE_S", 0.4)
    pool = UpstreamPool(HOSTS[:2], per_upstream_cap=2, healthy=always_healthy)
    slots = Slots(pool)
    keys = {preferred(pool, f"k{i}".encode()): f"k{i}".encode() for i in range(20)}
    key = keys[HOSTS[0]]
    slots.take(affinity=key, prompt=b"warm")  # h0 now holds this prompt
    slots.take(affinity=key, prompt=b"warm")  # and is full

    def waited_for(prompt: bytes) -> tuple[str, float]:
        started = time.monotonic()
        with pool.lease(affinity=key, prompt=prompt) as url:
            return url, time.monotonic() - started

    url, waited = waited_for(b"cold")
    assert url == HOSTS[1] and waited < SPILL_GRACE_S + 0.2
    url, waited = waited_for(b"warm")
    assert url == HOSTS[1] and 0.4 <= waited < 0.8


def test_past_the_warm_waiters_allowed_a_warm_prompt_spills_after_the_short_grace(monkeypatch):
    """Each waiter holds a task thread: more of them than the spare threads would leave the other
    hosts' freed slots with no thread to fill them."""
    monkeypatch.setattr("genfleet.workers.upstreams.WARM_SPILL_GRACE_S", 5.0)
    monkeypatch.setattr("genfleet.workers.upstreams.WARM_WAITERS_MAX", 1)
    pool = UpstreamPool(HOSTS[:2], per_upstream_cap=2, healthy=always_healthy)
    slots = Slots(pool)
    key = {preferred(pool, f"k{i}".encode()): f"k{i}".encode() for i in range(20)}[HOSTS[0]]
    slots.take(affinity=key, prompt=b"warm")
    slots.take(affinity=key, prompt=b"warm")  # h0 holds the prompt, and is full
    first_waits = threading.Thread(target=lambda: slots.take(affinity=key, prompt=b"warm"))
    first_waits.start()
    wait_until(lambda: waiting(pool) == 1, timeout=5)
    started = time.monotonic()
    assert slots.take(affinity=key, prompt=b"warm") == HOSTS[1]  # the second warm waiter: no long wait
    assert time.monotonic() - started < SPILL_GRACE_S + 0.2
    slots.give_back(0)
    first_waits.join(timeout=2)
    assert pool.in_flight() == {HOSTS[0]: 2, HOSTS[1]: 1}


def test_a_host_whose_circuit_opened_holds_no_warm_prompt():
    pool = UpstreamPool(HOSTS, per_upstream_cap=100, healthy=always_healthy)
    key = b"leading tokens of one prompt"
    with pool.lease(affinity=key, prompt=b"p") as home:
        pass
    for _ in range(pool.failure_threshold):
        pool.report(home, ok=False)
    assert not any(url == home for url, _ in pool._recent)


def waiting(pool: UpstreamPool) -> int:
    """Threads waiting for a slot: the pool's condition's own list of waiters (CPython's
    `threading.Condition._waiters`), so a test starts the next step once they wait, not after a sleep."""
    return len(pool._cond._waiters)
