"""Completion lengths as a compact log-spaced histogram: a few hundred bytes per dataset in Redis,
whatever the dataset's size, yet quantiles within ~5% of the exact ones.

Bucket 0 holds empty completions; bucket i >= 1 holds lengths in [2**((i-1)/8), 2**(i/8)), so each
bucket is ~9% wide and a million-token completion lands in bucket 160.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

BUCKETS_PER_OCTAVE = 8


def bucket_of(tokens: int) -> int:
    if tokens <= 0:
        return 0
    return 1 + math.floor(BUCKETS_PER_OCTAVE * math.log2(tokens))


def bucket_bounds(index: int) -> tuple[float, float]:
    """[low, high) in tokens."""
    if index <= 0:
        return 0.0, 0.0
    return 2 ** ((index - 1) / BUCKETS_PER_OCTAVE), 2 ** (index / BUCKETS_PER_OCTAVE)


@dataclass(frozen=True)
class LengthHistogram:
    counts: Mapping[int, int] = field(default_factory=dict)  # bucket index -> samples

    @classmethod
    def of(cls, lengths: Iterable[int]) -> LengthHistogram:
        counts: dict[int, int] = {}
        for tokens in lengths:
            index = bucket_of(tokens)
            counts[index] = counts.get(index, 0) + 1
        return cls(counts)

    @classmethod
    def from_redis(cls, raw: Mapping[bytes | str, bytes | str]) -> LengthHistogram:
        return cls({int(k): int(v) for k, v in raw.items() if int(v) > 0})

    @property
    def samples(self) -> int:
        return sum(self.counts.values())

    def merged(self, other: LengthHistogram) -> LengthHistogram:
        counts = dict(self.counts)
        for index, count in other.counts.items():
            counts[index] = counts.get(index, 0) + count
        return LengthHistogram(counts)

    def quantile(self, q: float) -> float | None:
        """Interpolated geometrically inside the bucket where the q-th sample falls."""
        n = self.samples
        if n == 0:
            return None
        target = min(max(q, 0.0), 1.0) * n
        seen = 0
        for index in sorted(self.counts):
            count = self.counts[index]
            if seen + count >= target and count:
                low, high = bucket_bounds(index)
                if index == 0:
                    return 0.0
                fraction = (target - seen) / count
                return low * (high / low) ** fraction
            seen += count
        return bucket_bounds(max(self.counts))[1]

    def mean(self) -> float | None:
        """From bucket midpoints (geometric); callers with exact token sums should prefer those."""
        n = self.samples
        if n == 0:
            return None
        return sum(count * _midpoint(index) for index, count in self.counts.items()) / n

    def stdev(self) -> float:
        n = self.samples
        if n < 2:
            return 0.0
        mean = self.mean() or 0.0
        return math.sqrt(sum(count * (_midpoint(i) - mean) ** 2 for i, count in self.counts.items()) / (n - 1))


def _midpoint(index: int) -> float:
    low, high = bucket_bounds(index)
    return math.sqrt(low * high)
