"""The steady-state window of a run, read off the simulators' own counters: it opens when the
first 10% of the requests have finished (a `/sim/stats/reset` on every host) and closes when 90%
have (a `/sim/stats` read), so ramp-up and the drain at the end stay outside it."""
from __future__ import annotations

import time
from dataclasses import dataclass

import httpx


@dataclass(frozen=True)
class Window:
    seconds: float
    mean_running: float  # time-averaged running requests, summed over hosts
    peak_running: int  # summed over hosts
    tokens: int
    requests: int

    def occupancy(self, slots: int) -> float:
        """Time-averaged running requests as a fraction of the configured in-flight slots."""
        return self.mean_running / slots

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


class SteadyStateWindow:
    """Call `poll()` often (every ~50 ms) while a run of `total` requests goes on."""

    def __init__(self, sim_urls: list[str], total: int, opens_at: float = 0.1, closes_at: float = 0.9) -> None:
        self.urls = sim_urls
        self.open_count = max(1, round(total * opens_at))
        self.close_count = max(self.open_count + 1, round(total * closes_at))
        self.http = httpx.Client(timeout=5.0)
        self._finished_before = 0  # requests finished before the window opened
        self._opened_at: float | None = None
        self.window: Window | None = None

    @property
    def opened(self) -> bool:
        return self._opened_at is not None

    def reset(self) -> None:
        """Zero every host's counters: call right before the run starts."""
        for url in self.urls:
            self.http.post(f"{url}/sim/stats/reset").raise_for_status()

    def poll(self, *, ended: bool = False) -> None:
        """`ended`: the run is over; a window that opened closes on what the counters hold now (a run
        can end between two polls on a busy machine, before one saw `close_count`: the window then
        holds some of the drain too)."""
        if self.window is not None or (ended and self._opened_at is None):
            return
        stats = self._stats()
        finished = self._finished_before + sum(s["requests_finished"] for s in stats)
        if self._opened_at is None:
            if finished >= self.open_count:
                self.reset()
                self._opened_at = time.monotonic()
                self._finished_before = finished
        elif finished >= self.close_count or ended:
            self.window = Window(
                seconds=time.monotonic() - self._opened_at,
                mean_running=sum(s["mean_running"] for s in stats),
                peak_running=sum(s["peak_running"] for s in stats),
                tokens=sum(s["tokens_generated"] for s in stats),
                requests=finished - self._finished_before,
            )

    def close(self) -> None:
        self.http.close()

    def _stats(self) -> list[dict]:
        return [self.http.get(f"{url}/sim/stats").raise_for_status().json() for url in self.urls]


class JobWindow(SteadyStateWindow):
    """The steady-state window, plus the hosts' mean running count over the whole job: from the
    first `reset()` (call it at enqueue) to `job_mean_running()` (call it at the last completion).
    The hosts' counters restart when the window opens, so their mean so far is banked just before."""

    _job_started: float | None = None
    _since = 0.0  # when the hosts' counters last restarted
    _area = 0.0  # running × seconds before that

    def reset(self) -> None:
        if self._job_started is not None:
            self._area += sum(s["mean_running"] for s in self._stats()) * (time.monotonic() - self._since)
        super().reset()
        self._since = time.monotonic()
        if self._job_started is None:
            self._job_started = self._since

    def job_mean_running(self) -> float:
        """Time-averaged running requests, summed over hosts, from the job's start until now."""
        area = self._area + sum(s["mean_running"] for s in self._stats()) * (time.monotonic() - self._since)
        return area / (time.monotonic() - self._job_started)
