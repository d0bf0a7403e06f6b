"""Routes each generation to a healthy SGLang host with the fewest requests in flight from this
worker, with a per-host in-flight cap and a circuit breaker per host.

A host's circuit opens after consecutive failures; while open, the host gets no traffic. After a
cool-down, a `/health` probe (half-open) decides whether traffic returns. When no host can take a
request, `lease` waits: every slot of the worker then waits too, so the worker stops taking tasks
instead of burning through retries.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx

from workers.errors import ShutdownRequested, TransientError

log = logging.getLogger(__name__)


class NoUpstreamError(RuntimeError):
    pass


class NoUpstreamAvailable(TransientError):
    """Every upstream is down or full for longer than the caller could wait."""

    blames_upstream = False


@dataclass
class UpstreamState:
    url: str
    in_flight: int = 0
    consecutive_failures: int = 0
    open_until: float = 0.0  # circuit open (no traffic) until then; 0 = closed

    @property
    def is_open(self) -> bool:
        return self.open_until > 0


class UpstreamPool:
    def __init__(self, urls: list[str], *, per_upstream_cap: int, failure_threshold: int = 3,
                 open_s: float = 30.0, probe_interval_s: float = 15.0) -> None:
        if not urls:
            raise NoUpstreamError("no SGLang upstream configured: pass --upstream URL (or GENFLEET_UPSTREAMS)")
        self.states = {url.rstrip("/"): UpstreamState(url.rstrip("/")) for url in urls}
        self.per_upstream_cap = per_upstream_cap
        self.failure_threshold = failure_threshold
        self.open_s = open_s
        self.probe_interval_s = probe_interval_s
        # Called with a host's URL when its circuit closes again (it may have restarted).
        self.on_recovered: Callable[[str], None] = lambda url: None
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._prober = threading.Thread(target=self._probe_loop, name="upstream-health", daemon=True)

    @property
    def urls(self) -> list[str]:
        return list(self.states)

    @contextmanager
    def lease(self, *, avoid: str | None = None, wait_s: float = 600.0,
              should_stop: Callable[[], bool] = lambda: False) -> Iterator[str]:
        """One slot on the least busy healthy upstream, other than `avoid` (the one that just failed)
        when another can take it."""
        deadline = time.monotonic() + wait_s
        with self._cond:
            while (state := self._pick(avoid)) is None:
                if should_stop():
                    raise ShutdownRequested()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise NoUpstreamAvailable(f"no healthy upstream with a free slot for {wait_s:.0f} s: "
                                              + ", ".join(self._describe()))
                self._cond.wait(timeout=min(remaining, 1.0))
            state.in_flight += 1
        try:
            yield state.url
        finally:
            with self._cond:
                state.in_flight -= 1
                self._cond.notify()

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
                log.warning("circuit open for %s after %d consecutive failures", url, state.consecutive_failures)

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
        """Half-open: an open circuit past its cool-down closes if `/health` answers 200. Closed
        circuits are probed too, so a dead host is found before traffic is sent to it."""
        for url, state in list(self.states.items()):
            if state.is_open and time.monotonic() < state.open_until:
                continue
            ok = _healthy(url)
            with self._cond:
                recovered = ok and state.is_open
                if recovered:
                    log.warning("circuit closed for %s: /health answered", url)
                    state.open_until, state.consecutive_failures = 0.0, 0
                    self._cond.notify_all()
                elif not ok:
                    state.consecutive_failures = max(state.consecutive_failures, self.failure_threshold)
                    state.open_until = time.monotonic() + self.open_s
            if recovered:
                self.on_recovered(url)

    def _pick(self, avoid: str | None) -> UpstreamState | None:
        ready = [s for s in self.states.values() if not s.is_open and s.in_flight < self.per_upstream_cap]
        if not ready:
            return None
        return min(ready, key=lambda s: (s.url == avoid, s.in_flight))

    def _describe(self) -> list[str]:
        return [f"{s.url} ({'down' if s.is_open else f'{s.in_flight} in flight'})" for s in self.states.values()]

    def _probe_loop(self) -> None:
        while not self._stop.wait(self.probe_interval_s):
            self.probe_once()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=20.0).status_code == 200
    except httpx.HTTPError:
        return False
