"""The ETA maths (`genfleet/status/eta.py`) and the length histogram it rests on, on synthetic distributions."""
from __future__ import annotations

import random

import pytest

from genfleet.common.fleet_stats import LengthHistogram, bucket_bounds, bucket_of
from genfleet.status.eta import FLEET, OWN, DatasetWork, PoolThroughput, estimate_etas, share_pool


def uniform_rate_eta(remaining: int, fleet_req_per_s: float) -> float | None:
    """The estimate genfleet replaces (the baseline the ETA is compared with here): remaining prompts
    over the fleet's prompt rate, as if every prompt cost the same."""
    return remaining / fleet_req_per_s if fleet_req_per_s > 0 else None


def lognormal_lengths(n: int, median: float, sigma: float, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [max(1, int(rng.lognormvariate(0, sigma) * median)) for _ in range(n)]


def test_histogram_quantiles_stay_within_a_bucket_of_the_exact_ones():
    lengths = sorted(lognormal_lengths(20000, median=800, sigma=1.0))
    histogram = LengthHistogram.of(lengths)
    for q in (0.5, 0.9, 0.99):
        exact = lengths[int(q * len(lengths)) - 1]
        assert histogram.quantile(q) == pytest.approx(exact, rel=0.1)
    assert histogram.mean() == pytest.approx(sum(lengths) / len(lengths), rel=0.05)
    assert len(histogram.counts) < 120  # compact: a few hundred bytes in Redis
    assert bucket_bounds(bucket_of(1000))[0] <= 1000 < bucket_bounds(bucket_of(1000))[1]
    assert LengthHistogram.of([0, 0, 5]).quantile(0.5) == 0.0


def test_a_long_tailed_dataset_gets_a_later_eta_than_a_uniform_rate_estimate():
    # The fleet finishes 10 prompts/s at 1,000 tok/s: 100 tokens a prompt on average. This dataset's
    # completions are long-tailed, ~5x the fleet's mean; 1,000 of its prompts are left.
    lengths = lognormal_lengths(400, median=300, sigma=1.2)
    tail = DatasetWork("swe", remaining=1000, lengths=LengthHistogram.of(lengths),
                       mean_tokens=sum(lengths) / len(lengths), served_tok_s={"short": 1000.0})
    (eta,) = estimate_etas([tail], {"short": PoolThroughput(1000.0, 1000.0, streams=20)}).values()
    uniform = uniform_rate_eta(1000, fleet_req_per_s=10.0)
    assert eta is not None and uniform == 100.0
    assert eta.low_s > 3 * uniform
    assert eta.low_s < eta.expected_s < eta.high_s
    assert eta.basis == OWN and eta.samples == 400


def test_the_last_concurrent_prompts_set_a_floor_from_the_length_tail():
    # 40 prompts left on a pool of 40 streams at 25 tok/s each: they all run at once, so the
    # dataset ends when its longest one does, not after "40 x mean / 1,000 tok/s" = 24 s.
    heavy = lognormal_lengths(2000, median=300, sigma=1.5)
    light = [600] * 2000  # same mean order, no tail
    pools = {"short": PoolThroughput(1000.0, 1000.0, streams=40)}
    etas = estimate_etas([
        DatasetWork("heavy", 40, LengthHistogram.of(heavy), served_tok_s={"short": 500.0}),
        DatasetWork("light", 40, LengthHistogram.of(light), served_tok_s={"short": 500.0}),
    ], pools)
    mean_based = 40 * (sum(heavy) / len(heavy)) / 1000.0
    assert etas["heavy"].expected_s > 5 * mean_based
    assert etas["heavy"].expected_s > etas["light"].expected_s


def test_the_range_narrows_as_samples_accumulate():
    pools = {"short": PoolThroughput(2000.0, 2000.0, streams=100)}
    widths = []
    for samples in (8, 80, 800, 8000):
        lengths = LengthHistogram.of(lognormal_lengths(samples, median=500, sigma=1.0, seed=samples))
        (eta,) = estimate_etas([DatasetWork("d", 100_000, lengths, served_tok_s={"short": 2000.0})],
                               pools).values()
        widths.append(eta.width)
    assert widths == sorted(widths, reverse=True) and widths[-1] < widths[0] / 5


def test_a_dataset_not_started_borrows_the_fleets_lengths_and_says_so():
    seen = LengthHistogram.of(lognormal_lengths(500, median=400, sigma=0.8))
    pools = {"short": PoolThroughput(1000.0, 1000.0, streams=50)}
    etas = estimate_etas([
        DatasetWork("running", 1000, seen, served_tok_s={"short": 1000.0}),
        DatasetWork("waiting", 1000, LengthHistogram()),
    ], pools)
    assert etas["running"].basis == OWN
    assert etas["waiting"].basis == FLEET and etas["waiting"].samples == 500
    # Behind in the queue: it starts when the running one ends, and its range is wider.
    assert etas["waiting"].expected_s > etas["running"].expected_s
    assert etas["waiting"].width > etas["running"].width


def test_eta_is_unknown_without_throughput_or_any_length_and_zero_when_done():
    lengths = LengthHistogram.of([100] * 10)
    stalled = {"short": PoolThroughput(0.0, 0.0)}
    assert estimate_etas([DatasetWork("d", 5, lengths)], stalled) == {"d": None}
    assert estimate_etas([DatasetWork("d", 5, LengthHistogram())], {"short": PoolThroughput(9.0, 9.0)}) == {"d": None}
    done = estimate_etas([DatasetWork("d", 0, lengths)], stalled)["d"]
    assert done is not None and done.expected_s == 0.0


def test_partitions_are_separate_pools():
    # The long pool is slow: a dataset routed there waits on it however fast the short pool is.
    lengths = LengthHistogram.of([1000] * 100)
    pools = {"short": PoolThroughput(10_000.0, 10_000.0), "long": PoolThroughput(100.0, 100.0)}
    etas = estimate_etas([
        DatasetWork("chat", 100, lengths, 1000.0, served_tok_s={"short": 10_000.0}, partition_mix={"short": 1.0}),
        DatasetWork("swe", 100, lengths, 1000.0, served_tok_s={"long": 100.0}, partition_mix={"long": 1.0}),
    ], pools)
    assert etas["chat"].expected_s == pytest.approx(10.0, rel=0.01)
    assert etas["swe"].expected_s == pytest.approx(1000.0, rel=0.01)


def test_processor_sharing_gives_a_finished_datasets_share_to_the_others():
    # a: 100 tokens, b: 1,000 tokens, served equally by 10 tok/s: a ends at 20 s, then b has the
    # whole pool for its last 900 tokens: 110 s, not 1,000 / 5 = 200 s.
    done = share_pool([("a", 100.0, 5.0), ("b", 1000.0, 5.0), ("c", 50.0, 0.0)], 10.0)
    assert done["a"] == pytest.approx(20.0)
    assert done["b"] == pytest.approx(110.0)
    assert done["c"] == pytest.approx(115.0)  # not served yet: after them


def test_a_dataset_not_started_is_less_certain_where_started_datasets_differ_more():
    pools = {"short": PoolThroughput(1000.0, 1000.0, streams=50)}

    def waiting_width(means: tuple[int, int]) -> float:
        work = [DatasetWork(f"d{m}", 100, LengthHistogram.of(lognormal_lengths(200, m, 0.5, seed=m)),
                            served_tok_s={"short": 500.0}) for m in means]
        return estimate_etas([*work, DatasetWork("next", 1000, LengthHistogram())], pools)["next"].width

    assert waiting_width((400, 2000)) > 2 * waiting_width((400, 440))


def test_a_just_started_datasets_short_first_completions_do_not_make_its_eta_short():
    # 7 done, all short (the long ones still run), 8 in flight; the fleet's completions average ~100.
    pools = {"short": PoolThroughput(1000.0, 1000.0, streams=100)}
    fleet = DatasetWork("older", 100, LengthHistogram.of(lognormal_lengths(2000, 70, 0.9)),
                        served_tok_s={"short": 800.0})
    early = DatasetWork("new", 443, LengthHistogram.of([13, 15, 16, 17, 18, 22, 29]), in_flight=8,
                        served_tok_s={"short": 200.0})
    naive = 443 * 17 / 1000.0
    eta = estimate_etas([fleet, early], pools)["new"]
    assert eta.basis == FLEET and eta.low_s > 2 * naive
