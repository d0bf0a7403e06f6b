"""ETA per dataset, as a range, from each dataset's own completion lengths and the fleet's token
throughput. Pure functions: `genfleet status` gathers the inputs from Redis, tests feed synthetic ones.

The method, and why:
- Work left is measured in tokens, not prompts: datasets whose completions differ 5x in length
  finish 5x apart at the same prompt rate (the seeds' uniform-rate ETA was off by days). A dataset
  with no finished prompt yet borrows the lengths seen fleet-wide, and says so (`basis`); one that
  has just started blends in the fleet's, since its first completions are its shortest.
- Remaining tokens = remaining prompts x mean length. Its uncertainty combines the error of the
  mean (sd / sqrt(samples): the range narrows as samples accumulate; for a dataset not started,
  how far datasets' means differ from each other) and the spread of the sum of the remaining
  draws; the range is log-normal, so the late side is the longer one.
- Each partition's pool is shared: datasets being served now split its throughput in proportion to
  what they get now, a dataset that finishes frees its share for the others, datasets not served
  yet (behind in the queue) follow. Optimistic and pessimistic ends also use the higher and lower
  of the 1- and 10-minute throughputs.
- The tail sets a floor: the last prompts run concurrently, so a dataset ends no sooner than the
  longest of its last `min(remaining, streams)` completions takes at one stream's speed. A
  long-tailed dataset thus ends later than its mean length alone suggests.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from genfleet.common.fleet_stats import LengthHistogram

# Two-sided 95% interval.
Z = 1.96
# Below this many samples a dataset's own spread is not trusted; the fleet's (or mean-sized) is used.
MIN_SPREAD_SAMPLES = 5
# A dataset's own lengths get half the weight once it has finished this many prompts (more if more
# of its prompts are running: those are the long ones).
TRUST_SAMPLES = 20

OWN = "own"  # the dataset's own completion lengths
FLEET = "fleet"  # few or none of its own finished yet: mostly lengths seen fleet-wide


@dataclass(frozen=True)
class Eta:
    low_s: float
    expected_s: float
    high_s: float
    basis: str  # OWN or FLEET
    samples: int  # completion lengths the estimate rests on

    @property
    def width(self) -> float:
        """Relative width of the range: shrinks as samples accumulate."""
        return (self.high_s - self.low_s) / self.expected_s if self.expected_s > 0 else 0.0


@dataclass(frozen=True)
class DatasetWork:
    name: str
    remaining: int  # prompts not finished yet (queued or in flight)
    lengths: LengthHistogram  # its finished completions
    mean_tokens: float | None = None  # exact mean when known (token counters); else from `lengths`
    in_flight: int = 0  # its prompts running now
    # partition -> completion tok/s the dataset gets there now (0 or absent: not being served)
    served_tok_s: Mapping[str, float] = field(default_factory=dict)
    # partition -> share of its prompts that go there; empty: the fleet's mix
    partition_mix: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class PoolThroughput:
    """A partition's workers: completion tok/s over the last 1 and 10 minutes, streams running now,
    and one stream's decode speed (tokens per second of request time; 0: unknown)."""
    tok_s_1m: float
    tok_s_10m: float
    streams: int = 0
    stream_tok_s: float = 0.0

    def scenario(self, which: int) -> float:
        """-1 pessimistic, 0 expected, +1 optimistic. The 10-minute rate is the steadier one."""
        rates = [r for r in (self.tok_s_1m, self.tok_s_10m) if r > 0]
        if not rates:
            return 0.0
        if which == 0:
            return self.tok_s_10m if self.tok_s_10m > 0 else rates[0]
        return max(rates) if which > 0 else min(rates)


@dataclass(frozen=True)
class _Tokens:
    low: float
    expected: float
    high: float
    basis: str
    samples: int
    lengths: LengthHistogram


def estimate_etas(work: list[DatasetWork], pools: Mapping[str, PoolThroughput],
                  fleet_lengths: LengthHistogram | None = None,
                  fleet_mix: Mapping[str, float] | None = None) -> dict[str, Eta | None]:
    """ETA per dataset name; None where it cannot be known yet (no length seen anywhere, or no
    throughput in a pool the dataset needs). `fleet_lengths` defaults to all datasets' lengths
    merged, `fleet_mix` (partition -> share of prompts) to an even split over `pools`."""
    if fleet_lengths is None:
        fleet_lengths = LengthHistogram()
        for item in work:
            fleet_lengths = fleet_lengths.merged(item.lengths)
    default_mix = _normalised(fleet_mix or {}) or {partition: 1.0 / len(pools) for partition in pools}
    between = spread_between_datasets(work)
    tokens = {item.name: remaining_tokens(item, fleet_lengths, between) for item in work}

    # name -> [low, expected, high] seconds; None once any pool it needs cannot say.
    finishes: dict[str, list[float | None]] = {}
    for partition, pool in pools.items():
        for position, scenario in enumerate((+1, 0, -1)):  # optimistic throughput -> low ETA
            jobs = []
            for item in work:
                estimate = tokens[item.name]
                share = (_normalised(item.partition_mix) or default_mix).get(partition, 0.0)
                if estimate is None or share <= 0 or item.remaining <= 0:
                    continue
                amount = (estimate.low, estimate.expected, estimate.high)[position] * share
                jobs.append((item.name, amount, item.served_tok_s.get(partition, 0.0)))
            for name, seconds in share_pool(jobs, pool.scenario(scenario)).items():
                times = finishes.setdefault(name, [0.0, 0.0, 0.0])
                current = times[position]
                times[position] = None if seconds is None or current is None else max(current, seconds)

    out: dict[str, Eta | None] = {}
    for item in work:
        estimate, ends = tokens[item.name], finishes.get(item.name)
        if item.remaining <= 0:
            out[item.name] = Eta(0.0, 0.0, 0.0, OWN, item.lengths.samples)
        elif estimate is None or ends is None or None in ends:
            out[item.name] = None
        else:
            floor = tail_floor(item, estimate.lengths, pools, default_mix)
            low, expected, high = (max(t, floor) for t in ends if t is not None)
            out[item.name] = Eta(low, expected, high, estimate.basis, estimate.samples)
    return out


def remaining_tokens(item: DatasetWork, fleet: LengthHistogram,
                     between_datasets: float | None = None) -> _Tokens | None:
    """Completion tokens still to generate: (low, expected, high) of a 95% range.

    `between_datasets` is how far datasets' mean lengths sit from each other (relative standard
    deviation): how wrong the fleet's mean may be for a dataset with no completion of its own."""
    own, n = item.lengths, item.lengths.samples
    if n == 0 and fleet.samples == 0:
        return None
    # A dataset's first completions are its shortest: the long ones are still running. Its own
    # lengths are trusted in proportion to how many finished against how many run (or a minimum).
    trust = n / (n + max(item.in_flight, TRUST_SAMPLES)) if n else 0.0
    if fleet.samples == 0:
        trust = 1.0
    own_mean = (item.mean_tokens if item.mean_tokens is not None else own.mean()) or 0.0
    fleet_mean = fleet.mean() or 0.0
    mean = trust * own_mean + (1 - trust) * fleet_mean
    basis = OWN if trust >= 0.5 else FLEET
    lengths = own if basis == OWN else fleet
    own_spread = own.stdev() if n >= MIN_SPREAD_SAMPLES else 0.0
    fleet_spread = fleet.stdev() if fleet.samples >= MIN_SPREAD_SAMPLES else 0.0
    spread = (own_spread if basis == OWN else fleet_spread) or own_spread or fleet_spread or mean
    # Error of the dataset's mean: its own sample's (shrinks as completions accumulate), and for
    # the part taken from the fleet, how far datasets' means differ (else one per-sample sd).
    own_error = (own_spread or spread) / math.sqrt(n) if n else 0.0
    prior_error = fleet_mean * between_datasets if between_datasets is not None else (fleet_spread or spread)
    mean_error = math.hypot(trust * own_error, (1 - trust) * prior_error)
    remaining = item.remaining
    expected = remaining * mean
    # The error of the mean scales with every remaining prompt; the draws' own spread only with √n.
    sd = math.sqrt((remaining * mean_error) ** 2 + remaining * spread ** 2)
    factor = _lognormal_factor(sd / expected) if expected > 0 else 1.0
    return _Tokens(expected / factor, expected, expected * factor, basis, lengths.samples, lengths)


def spread_between_datasets(work: list[DatasetWork]) -> float | None:
    """Relative standard deviation of the mean lengths of the datasets that have a few samples."""
    candidates = [item.mean_tokens if item.mean_tokens is not None else item.lengths.mean()
                  for item in work if item.lengths.samples >= MIN_SPREAD_SAMPLES]
    means = [m for m in candidates if m]
    if len(means) < 2:
        return None
    average = sum(means) / len(means)
    return math.sqrt(sum((m - average) ** 2 for m in means) / (len(means) - 1)) / average


def share_pool(jobs: list[tuple[str, float, float]], tok_s: float) -> dict[str, float | None]:
    """Processor sharing of one pool: (name, tokens left, tok/s it gets now) -> seconds to finish.

    Jobs served now split `tok_s` in proportion to what they get now; when one finishes, the rest
    split its share. Jobs not served yet (0 tok/s: behind in the queue) start once those are done
    and drain together. None for every job when the pool has no throughput."""
    if not jobs:
        return {}
    if tok_s <= 0:
        return {name: None for name, _, _ in jobs}
    done: dict[str, float | None] = {}
    clock = 0.0
    active = {name: [left, weight] for name, left, weight in jobs if weight > 0 and left > 0}
    for name, left, _ in jobs:
        if left <= 0:
            done[name] = 0.0
    while active:
        total_weight = sum(weight for _, weight in active.values())
        step = min(left / (tok_s * weight / total_weight) for left, weight in active.values())
        clock += step
        for name in list(active):
            left, weight = active[name]
            left -= step * tok_s * weight / total_weight
            if left <= 1e-9 * max(1.0, step * tok_s):
                done[name] = clock
                del active[name]
            else:
                active[name][0] = left
    waiting = [(name, left) for name, left, weight in jobs if weight <= 0 and left > 0]
    if waiting:
        end = clock + sum(left for _, left in waiting) / tok_s
        done.update({name: end for name, _ in waiting})
    return done


def tail_floor(item: DatasetWork, lengths: LengthHistogram, pools: Mapping[str, PoolThroughput],
               default_mix: Mapping[str, float]) -> float:
    """The longest of the dataset's last concurrent completions, at one stream's speed."""
    floor = 0.0
    mix = _normalised(item.partition_mix) or default_mix
    for partition, share in mix.items():
        pool = pools.get(partition)
        if pool is None or share <= 0 or pool.streams <= 0 or pool.scenario(0) <= 0:
            continue
        # Measured per request where known: the pool's rate over today's streams overstates it
        # once streams drain at a run's end.
        stream_tok_s = pool.stream_tok_s or pool.scenario(0) / pool.streams
        last = max(1, min(math.ceil(item.remaining * share), pool.streams))
        longest = lengths.quantile(1 - 1 / (last + 1)) or 0.0
        floor = max(floor, longest / stream_tok_s)
    return floor


def _lognormal_factor(relative_sd: float) -> float:
    sigma = math.sqrt(math.log1p(relative_sd ** 2))
    return math.exp(Z * sigma)


def _normalised(mix: Mapping[str, float]) -> dict[str, float]:
    total = sum(v for v in mix.values() if v > 0)
    return {k: v / total for k, v in mix.items() if v > 0} if total > 0 else {}
