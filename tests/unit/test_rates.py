"""The per-minute rate buckets behind `genfleet status` and its ETA, against a real Redis: rates
over sliding windows, errors, stream speed, a young run's shorter window, bucket expiry."""
from __future__ import annotations

import pytest
from helpers.run_stats import record_completion

from genfleet.common import fleet_stats
from genfleet.status.read_model import read_status


def test_rate_buckets_give_rates_over_sliding_windows(redis_client):
    start = 1_000_020.0  # 20 s into a minute
    for second in range(0, 600, 2):  # one prompt of 100 tokens every 2 s for 10 minutes
        record_completion(redis_client, "r", "d", "short", 100, seconds=4.0, now=start + second)
    fleet_stats.record_failure(redis_client, "r", "d", "short", now=start + 599)
    now = start + 600
    window = fleet_stats.read_rates(redis_client, "r", since=start, now=now)[("d", "short")]
    assert window[60].req_per_min == pytest.approx(30, rel=0.05)
    assert window[60].tok_per_s == pytest.approx(50, rel=0.05)
    assert window[600].req_per_min == pytest.approx(30, rel=0.02)
    assert window[600].errors == 1 and window[600].error_share == pytest.approx(1 / 301)
    assert window[600].stream_tok_s == pytest.approx(25)  # 100 tokens in 4 s of request time
    # Two minutes into a run, its rate is over two minutes, not ten.
    early = fleet_stats.read_rates(redis_client, "r", since=now - 120, now=now)[("d", "short")]
    assert early[600].req_per_min == pytest.approx(300 / 2, rel=0.02)
    assert redis_client.ttl(f"genfleet:r:rate:{int((now - 2) // 60)}") > 3600
    status = read_status(redis_client, "r", now=now)  # no datasets registered: nothing to show
    assert status.datasets == [] and status.workers == 0
