"""Routes each generation to a healthy SGLang host, with a per-host in-flight cap and a circuit
breaker per host. The cap is the worker's share of its in-flight count, or with `--in-flight auto`
what the host's own load allows (workers/admission.py sets it).

Routing is prefix-cache aware, with bounded load. Each SGLang server keeps a radix cache of the
prefixes it has computed (0.5.23 `mem_cache/radix_cache.py`): a prompt whose prefix is cached skips
that part of its prefill. Prompts that share a prefix (the samples of one prompt, the parts of a
continued completion, the turns of a conversation, a long shared system prompt) therefore go to the
same host: the one rendezvous hashing of their affinity key ranks first among the healthy hosts (so
a host that goes down moves only its own keys). The preferred host is skipped when it holds more
than `LOAD_FACTOR` times the mean in flight (bounded-load consistent hashing, Mirrokni, Thorup and
Zadimoghaddam 2018) or has no free slot; the least busy host takes the request then. When every
host is full, a freed slot goes first to a waiting request that prefers that host; one that does not
takes it after `SPILL_GRACE_S`, so a slot never idles long. A request whose prompt itself this worker
sent to that host lately (a sample after the first, a conversation's next turn, a continued
completion's next part) finds it in that host's cache: it goes there past the load bound (up to the
cap) and waits `WARM_SPILL_GRACE_S` for a slot before spilling. Without a key (or with
`GENFLEET_ROUTING=least-busy`) the least busy host takes every request.

A host's circuit opens after consecutive failures; while open, the host gets no traffic. After a
cool-down, the server kind's health probe (half-open) decides whether traffic returns. When no host can take a
request, `lease` waits: every slot of the worker then waits too, so the worker stops taking tasks
instead of burning through retries.
"""
from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from genfleet.common.records import Routing, choices
from genfleet.workers.errors import NoFreeSlot, NoUpstreamError, ShutdownRequested

log = logging.getLogger(__name__)

# A host may hold up to this many times the mean in flight before its keys spill to others.
LOAD_FACTOR = 1.25
# How long a freed slot waits for a request that prefers its host before any request takes it: far
# below a generation's seconds, so the slot's idle time is noise.
SPILL_GRACE_S = 0.05
# How long a request waits instead for its preferred host when that host holds its prompt already (a
# sample after the first, a conversation's next turn, a continued completion's next part). Spilling
# it would prefill the whole prompt again elsewhere: for a 1,500-token prompt ~75 ms of a whole
# 8-GPU server (20,000 prefill tokens/s, bench/affinity.py), during which its 150 running requests
# do not decode; a slot idle for the wait costs 1/150 of the server for that long, so waiting
# pays up to seconds. Measured (bench.affinity, 4 hosts): spills moved 62 of 1,200 samples and 23
# of 300 turns to a cold host: ~15% of the prompt tokens the hosts prefilled.
WARM_SPILL_GRACE_S = 2.0
# Requests that may wait the longer grace at once, per worker: no more than its spare threads
# (`workers/runtime.py`, 16). Each waiter holds a task thread; past the spares, another host's freed
# slot would have no thread to fill it. The bound costs cache: bench.affinity at 4 hosts measured
# prefill 0.45x least-busy's without it, 0.51x with 16, 0.53x with 8 (one run each, 2026-12-01).
WARM_WAITERS_MAX = 16
# (host, prompt) pairs remembered per worker (~200 bytes each); samples are queued 256 prompts apart.
PROMPTS_REMEMBERED = 16_384


@dataclass
class UpstreamState:
    url: str
    cap: int  # this worker's streams to the host at most: fixed, or set by workers/admission.py
    in_flight: int = 0
    consecutive_failures: int = 0
    open_until: float = 0.0  # circuit open (no traffic) until then; 0 = closed

    @property
    def is_open(self) -> bool:
        return self.open_until > 0


class UpstreamPool:
    def __init__(self, urls: list[str], *, per_upstream_cap: int, healthy: Callable[[str], bool],
                 failure_threshold: int = 3, open_s: float = 30.0, probe_interval_s: float = 15.0,
                 routing: str = "affinity") -> None:
        if not urls:
            raise NoUpstreamError("no SGLang upstream configured: pass --upstream URL (or GENFLEET_UPSTREAMS)")
        self.states = {url.rstrip("/"): UpstreamState(url.rstrip("/"), cap=per_upstream_cap) for url in urls}
        if routing not in choices(Routing):
            raise NoUpstreamError(f"GENFLEET_ROUTING must be one of {', '.join(choices(Routing))}, not {routing!r}")
        self.routing = routing
        self.failure_threshold = failure_threshold
        self.open_s = open_s
        self.probe_interval_s = probe_interval_s
        self.healthy_now = healthy  # the server kind's health probe (workers/servers/)
        # Called with a host's URL when its circuit closes again (it may have restarted).
        self.on_recovered: Callable[[str], None] = lambda url: None
        self._cond = threading.Condition()
        # (host, prompt) pairs lately sent, oldest first: the prompt is warm in that host's cache.
        self._recent: OrderedDict[tuple[str, bytes], None] = OrderedDict()
        self._warm_waiting = 0  # requests now waiting the longer grace for their warm host
        self._stop = threading.Event()
        self._prober = threading.Thread(target=self._probe_loop, name="upstream-health", daemon=True)

    @property
    def urls(self) -> list[str]:
        return list(self.states)

    @contextmanager
    def lease(self, *, avoid: str | None = None, wait_s: float = 600.0,
              should_stop: Callable[[], bool] = lambda: False, affinity: bytes | None = None,
              prompt: bytes | None = None) -> Iterator[str]:
        """One slot on a healthy upstream other than `avoid` (the one that just failed) when another
        can take it: the host `affinity` prefers within the load bound, else the least busy. A
        `prompt` (its identity) this pool sent to the preferred host lately is warm there: it goes
        there past the load bound, and waits `WARM_SPILL_GRACE_S` for a slot before spilling."""
        deadline = grace_from = time.monotonic()
        deadline += wait_s
        waiting_warm = False  # counted in `_warm_waiting`: waits the longer grace
        with self._cond:
            try:
                while True:
                    grace = WARM_SPILL_GRACE_S if waiting_warm else SPILL_GRACE_S
                    state = self._pick(avoid, affinity, prompt, waited=time.monotonic() - grace_from, grace=grace)
                    if state is not None:
                        break
                    if should_stop():
                        raise ShutdownRequested()
                    now = time.monotonic()
                    remaining = deadline - now
                    if remaining <= 0:
                        # What the wait means for the prompt is decided in workers/failures.py.
                        raise NoFreeSlot(f"no free slot on a healthy upstream for {wait_s:.0f} s: "
                                         + ", ".join(self._describe()),
                                         healthy=any(not s.is_open for s in self.states.values()))
                    if self._has_free_slot():  # only its preferred host is full: wait out the grace
                        if (not waiting_warm and self._warm_waiting < WARM_WAITERS_MAX
                                and self._warm_on_preferred(affinity, avoid, prompt)):
                            waiting_warm = True
                            self._warm_waiting += 1
                            continue
                        self._cond.wait(timeout=max(min(grace_from + grace - now, remaining), 0.001))
                    else:
                        # A new wait for a slot: its grace starts when one frees.
                        self._cond.wait(timeout=min(remaining, 1.0))
                        grace_from = time.monotonic()
            finally:
                if waiting_warm:
                    self._warm_waiting -= 1
            state.in_flight += 1
            if prompt is not None and self._keyed(affinity):
                self._remember(state.url, prompt)
        try:
            yield state.url
        finally:
            with self._cond:
                state.in_flight -= 1
                # Every waiter looks: the one that prefers this host takes it first.
                self._cond.notify_all()

    def report(self, url: str, *, ok: bool) -> None:
        """The outcome of a request, for the breaker: only failures that blame the host count."""
        with self._cond:
            state = self.states[url]
            if ok:
                state.consecutive_failures = 0
                return
            state.consecutive_failures += 1
            if state.consecutive_failures >= self.failure_threshold and not state.is_open:
                state.open_until = time.monotonic() + self.open_s
                self._forget_host(url)
                log.warning("circuit open for %s after %d consecutive failures", url, state.consecutive_failures)

    def set_cap(self, url: str, cap: int) -> None:
        """A host's new cap; a raise wakes the requests waiting for a slot. Streams above a lowered
        cap run to their end: the host gets no new one until it is under the cap again."""
        with self._cond:
            state = self.states[url]
            raised, state.cap = cap > state.cap, cap
            if raised:
                self._cond.notify_all()

    def in_flight(self) -> dict[str, int]:
        with self._cond:
            return {url: state.in_flight for url, state in self.states.items()}

    def healthy(self) -> list[str]:
        with self._cond:
            return [url for url, state in self.states.items() if not state.is_open]

    def start_probes(self) -> None:
        self._prober.start()

    def stop_probes(self) -> None:
        self._stop.set()

    def probe_once(self) -> None:
        """Half-open: an open circuit past its cool-down closes if its health probe passes. Closed
        circuits are probed too, so a dead host is found before traffic is sent to it."""
        for url, state in list(self.states.items()):
            if state.is_open and time.monotonic() < state.open_until:
                continue
            ok = self.healthy_now(url)
            with self._cond:
                recovered = ok and state.is_open
                if recovered:
                    log.warning("circuit closed for %s: its health probe passed", url)
                    state.open_until, state.consecutive_failures = 0.0, 0
                    self._cond.notify_all()
                elif not ok:
                    state.consecutive_failures = max(state.consecutive_failures, self.failure_threshold)
                    state.open_until = time.monotonic() + self.open_s
                    self._forget_host(url)
            if recovered:
                self.on_recovered(url)

    def _pick(self, avoid: str | None, affinity: bytes | None = None, prompt: bytes | None = None, *,
              waited: float = float("inf"), grace: float = SPILL_GRACE_S) -> UpstreamState | None:
        """The host for the next request, or None to wait. `waited`: how long the request has
        waited for a slot; past its `grace`, a request whose preferred host is full goes elsewhere."""
        ready = [s for s in self.states.values() if not s.is_open and s.in_flight < s.cap]
        if self._keyed(affinity):
            preferred = self._preferred(affinity, avoid)  # type: ignore[arg-type]
            if preferred is not None:
                if preferred in ready and (self._warm(preferred, prompt) or preferred.in_flight < self._load_bound()):
                    return preferred
                if preferred not in ready and waited < grace:
                    return None
        if not ready:
            return None
        return min(ready, key=lambda s: (s.url == avoid, s.in_flight))

    def _keyed(self, affinity: bytes | None) -> bool:
        return affinity is not None and self.routing == "affinity" and len(self.states) > 1

    def _warm(self, state: UpstreamState, prompt: bytes | None) -> bool:
        return prompt is not None and (state.url, prompt) in self._recent

    def _warm_on_preferred(self, affinity: bytes | None, avoid: str | None, prompt: bytes | None) -> bool:
        preferred = self._preferred(affinity, avoid) if self._keyed(affinity) else None  # type: ignore[arg-type]
        return preferred is not None and self._warm(preferred, prompt)

    def _forget_host(self, url: str) -> None:
        """A host that went down may come back with an empty cache: none of its prompts is warm."""
        for pair in [pair for pair in self._recent if pair[0] == url]:
            del self._recent[pair]

    def _remember(self, url: str, prompt: bytes) -> None:
        self._recent[(url, prompt)] = None
        self._recent.move_to_end((url, prompt))
        if len(self._recent) > PROMPTS_REMEMBERED:
            self._recent.popitem(last=False)

    def _preferred(self, affinity: bytes, avoid: str | None) -> UpstreamState | None:
        """Rendezvous (highest random weight) hashing over the healthy hosts."""
        healthy = [s for s in self.states.values() if not s.is_open and s.url != avoid]
        return max(healthy, key=lambda s: _weight(affinity, s.url), default=None)

    def _load_bound(self) -> float:
        healthy = [s for s in self.states.values() if not s.is_open]
        mean = (sum(s.in_flight for s in healthy) + 1) / max(len(healthy), 1)
        return LOAD_FACTOR * mean

    def _has_free_slot(self) -> bool:
        return any(not s.is_open and s.in_flight < s.cap for s in self.states.values())

    def _describe(self) -> list[str]:
        return [f"{s.url} ({'down' if s.is_open else f'{s.in_flight} in flight'})" for s in self.states.values()]

    def _probe_loop(self) -> None:
        while not self._stop.wait(self.probe_interval_s):
            try:
                self.probe_once()
            except Exception:  # noqa: BLE001 - the prober must outlive one bad probe (a client closed at shutdown)
                if not self._stop.is_set():
                    log.exception("upstream health probe failed")


def _weight(key: bytes, url: str) -> int:
    return int.from_bytes(hashlib.blake2b(key + url.encode(), digest_size=8).digest(), "little")

