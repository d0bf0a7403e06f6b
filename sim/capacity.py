"""The capacity model: slots, a decode speed that falls as more requests run, and occupancy stats.

Every running request decodes at the same speed, `rate / (1 + running / knee)` tokens/s, except
while a prefill batch has the GPU (sim.prefill_lane: `pause_decoding`), when nobody decodes, as in
SGLang 0.5.23's scheduler without `--enable-mixed-chunk`. So one shared "decode clock" (tokens
decoded per request since start) integrates that piecewise-constant speed exactly as `running`
changes and pauses begin and end; a request's progress is the clock's advance since its prefill
ended. A pause's end is known when it begins, so the clock needs no call at that moment to be
exact. The same bookkeeping integrates `running` over time, which gives an exact time-weighted mean
occupancy.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from genfleet.sim.prefix_cache import DEFAULT_PAGE_SIZE, DEFAULT_PREFIX_CACHE_TOKENS

# SGLang 0.5.23's --max-prefill-tokens default (`arg_groups/fields/schedule.py`).
DEFAULT_MAX_PREFILL_TOKENS = 16384


@dataclass(frozen=True)
class CapacitySettings:
    rate: float = 100.0
    knee: float = 64.0
    prefill_rate: float = 50_000.0  # prompt tokens/s of the server's prefill (sim.prefill_lane)
    max_prefill_tokens: int = DEFAULT_MAX_PREFILL_TOKENS  # uncached tokens in one prefill batch
    max_running: int | None = None
    prefix_cache_tokens: int = DEFAULT_PREFIX_CACHE_TOKENS  # 0: no prefix cache (sim.prefix_cache)
    page_size: int = DEFAULT_PAGE_SIZE  # the prefix cache's granularity, in tokens


@dataclass(frozen=True)
class CapacityStats:
    running: int
    waiting: int
    peak_running: int
    mean_running: float
    requests_started: int
    requests_finished: int
    requests_disconnected: int
    # Ended by an abort: POST /abort_request, or a client that left (sim.aborts).
    aborted_requests: int
    # Every token decoded, those of requests aborted or whose client left included (GPU time spent).
    tokens_generated: int
    # At each prefill: the prompt's tokens, those found in the prefix cache, and the rest, which
    # were prefilled (what the GPU spent on prompts).
    prompt_tokens_total: int
    cached_tokens_total: int
    prefill_tokens_computed: int
    # Prefill batches run, and the seconds they took, during which nobody decoded (sim.prefill_lane).
    prefill_batches: int
    prefill_busy_s: float
    uptime_s: float


class Capacity:
    """Running and waiting requests, the shared decode clock, and counters since the last reset."""

    def __init__(self, settings: CapacitySettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self._clock = clock
        self._started_at = self._last = clock()
        self._decoded = self._running_area = 0.0
        self._paused_until: float | None = None  # the end of the prefill batch running now
        self.running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self.reset_stats()

    # -- decode clock -------------------------------------------------------------------------

    def decode_rate(self) -> float:
        """Tokens/s of each running request right now: none while a prefill batch runs."""
        self._advance()
        return 0.0 if self._paused_until is not None else self._speed()

    def progress(self) -> float:
        """Tokens each running request has decoded since the server started (a shared clock)."""
        self._advance()
        return self._decoded

    def seconds_until(self, progress: float) -> float:
        """When the decode clock reaches `progress`, if `running` stays as it is and no further
        prefill batch starts: the rest of the running batch's pause, then decoding. A waiter wakes
        and re-checks; one woken early by a later pause simply sleeps again."""
        now = self._advance()
        remaining = progress - self._decoded
        if remaining <= 0:
            return 0.0
        paused = self._paused_until - now if self._paused_until is not None else 0.0
        return paused + remaining / self._speed()

    def pause_decoding(self, seconds: float) -> None:
        """Stop the decode clock for `seconds` from now: a prefill batch has the GPU."""
        now = self._advance()
        self._paused_until = now + seconds
        self._prefill_batches += 1
        self._prefill_busy_s += seconds

    # -- slots --------------------------------------------------------------------------------

    async def acquire(self) -> None:
        """Take a running slot, waiting in FIFO order while `max_running` are busy."""
        if not self._waiters and self._has_room():
            self._start_one()
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot was handed over just as the client went away
            elif waiter in self._waiters:  # a release in between may have dropped it already
                self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        self._advance()
        self.running -= 1
        while self._waiters and self._has_room():
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._start_one()
                waiter.set_result(None)

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    # -- counters -----------------------------------------------------------------------------

    def record_tokens(self, count: int) -> None:
        self._tokens_generated += count

    def record_prefill(self, prompt_tokens: int, cached_tokens: int) -> None:
        self._prompt_tokens += prompt_tokens
        self._cached_tokens += cached_tokens

    def record_finished(self) -> None:
        self._requests_finished += 1

    def record_disconnected(self) -> None:
        self._requests_disconnected += 1

    def record_aborted(self) -> None:
        self._aborted_requests += 1

    def stats(self) -> CapacityStats:
        now = self._advance()
        elapsed = now - self._stats_since
        return CapacityStats(
            running=self.running,
            waiting=self.waiting,
            peak_running=self._peak_running,
            mean_running=self._running_area / elapsed if elapsed > 0 else float(self.running),
            requests_started=self._requests_started,
            requests_finished=self._requests_finished,
            requests_disconnected=self._requests_disconnected,
            aborted_requests=self._aborted_requests,
            tokens_generated=self._tokens_generated,
            prompt_tokens_total=self._prompt_tokens,
            cached_tokens_total=self._cached_tokens,
            prefill_tokens_computed=self._prompt_tokens - self._cached_tokens,
            prefill_batches=self._prefill_batches,
            prefill_busy_s=self._prefill_busy_s,
            uptime_s=now - self._started_at,
        )

    def reset_stats(self) -> None:
        self._stats_since = self._advance()
        self._running_area = 0.0
        self._peak_running = self.running
        self._requests_started = self._requests_finished = self._requests_disconnected = 0
        self._aborted_requests = 0
        self._tokens_generated = 0
        self._prompt_tokens = self._cached_tokens = 0
        self._prefill_batches, self._prefill_busy_s = 0, 0.0

    # -- internals ----------------------------------------------------------------------------

    def _has_room(self) -> bool:
        limit = self.settings.max_running
        return limit is None or self.running < limit

    def _start_one(self) -> None:
        self._advance()
        self.running += 1
        self._requests_started += 1
        self._peak_running = max(self._peak_running, self.running)

    def _speed(self) -> float:
        """Tokens/s of each running request while decoding."""
        return self.settings.rate / (1.0 + self.running / self.settings.knee)

    def _advance(self) -> float:
        """Integrate decode progress and occupancy up to now; `running` is constant since `_last`,
        and decoding stood still from `_last` until `_paused_until` (if set)."""
        now = self._clock()
        elapsed = now - self._last
        if elapsed > 0:
            decoding = elapsed
            if self._paused_until is not None:
                decoding = max(0.0, now - max(self._last, self._paused_until))
                if now >= self._paused_until:
                    self._paused_until = None
            self._decoded += decoding * self._speed()
            self._running_area += elapsed * self.running
            self._last = now
        return now
