"""A run's throughput minute by minute over the last hour, for the status page's charts.

Read through `common.rates.read_rates`, the one reader of the rate buckets: asked for windows of
1, 2, ... 60 minutes ending now, the difference between two consecutive windows is one minute's
worth (`read_rates` spreads a bucket's counts evenly over its elapsed part, so the minutes slide
with now, like the table's "1m" column). One pipelined read of the 61 buckets; the buckets expire
after two hours (`common/keys.py`), so an hour is always there.
"""
from __future__ import annotations

from dataclasses import dataclass

import redis

from genfleet.common import fleet_stats

MINUTES = 60


@dataclass(frozen=True)
class MinuteRate:
    ago_min: int  # the minute ending `ago_min` minutes before now (0: the last 60 s)
    req_per_min: float
    tok_per_s: float
    errors: float  # failed attempts in it
    seconds: float = 60.0  # what the rates are averaged over: less in the minute the run began


def read_minutes(client: redis.Redis, run: str, now: float, since: float | None = None,
                 minutes: int = MINUTES) -> list[MinuteRate]:
    """The whole run's (every dataset and partition) last `minutes` minutes, oldest first. A minute
    that began before `since` (the run's start) is averaged over its part after it, as `read_rates`
    does for `status`'s columns: a run 10 s old shows its rate, not a sixth of it."""
    windows = [60 * k for k in range(1, minutes + 1)]
    per_key = fleet_stats.read_rates(client, run, since=None, now=now, windows=windows)
    cumulative = {window: fleet_stats.WindowCounts(float(window)) for window in windows}
    for per_window in per_key.values():
        for window, counts in per_window.items():
            cumulative[window] = cumulative[window].plus(counts)
    series = []
    previous = fleet_stats.WindowCounts(0.0)
    for k, window in enumerate(windows):
        counts = cumulative[window]
        end = now - 60 * k
        seconds = 60.0 if since is None else min(60.0, max(end - since, 1.0))
        # Rounding of the spread-out buckets can leave a hair below zero.
        requests = max(counts.requests - previous.requests, 0.0)
        tokens = max(counts.tokens - previous.tokens, 0.0)
        errors = max(counts.errors - previous.errors, 0.0)
        series.append(MinuteRate(ago_min=k, req_per_min=60 * requests / seconds, tok_per_s=tokens / seconds,
                                 errors=errors, seconds=seconds))
        previous = counts
    return series[::-1]
