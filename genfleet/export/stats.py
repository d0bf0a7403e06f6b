"""Completion-length statistics per dataset, exact and in constant memory.

A completion's token count is bounded by `max_new_tokens`, so a count per distinct length holds the
whole distribution in at most that many entries whatever the number of records: median and p99 are
exact, not sampled. Computed over every unique record read (before `--drop-truncated` and the other
filters), since they describe what the run generated.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from genfleet.export.records import Record, generated_turns


@dataclass
class LengthDistribution:
    counts: Counter[int] = field(default_factory=Counter)
    n: int = 0
    total: int = 0
    total_squares: int = 0  # Python ints: exact, so the variance has no cancellation error

    def add(self, value: int) -> None:
        self.counts[value] += 1
        self.n += 1
        self.total += value
        self.total_squares += value * value

    @property
    def mean(self) -> float:
        return self.total / self.n if self.n else 0.0

    @property
    def std(self) -> float:
        """Population standard deviation."""
        if not self.n:
            return 0.0
        return math.sqrt(max(self.n * self.total_squares - self.total * self.total, 0)) / self.n

    def quantile(self, q: float) -> float:
        """Nearest-rank quantile; the median (q=0.5) averages the two middle values of an even count."""
        if not self.n:
            return 0.0
        if q == 0.5 and self.n % 2 == 0:
            return (self._ranked(self.n // 2) + self._ranked(self.n // 2 + 1)) / 2
        return float(self._ranked(max(1, math.ceil(q * self.n))))

    def _ranked(self, rank: int) -> int:
        """The value at 1-based `rank` in sorted order."""
        seen = 0
        for value in sorted(self.counts):
            seen += self.counts[value]
            if seen >= rank:
                return value
        raise IndexError(rank)


@dataclass
class DatasetStats:
    completion_tokens: LengthDistribution = field(default_factory=LengthDistribution)
    reasoning_tokens: int = 0
    at_max_tokens: int = 0  # finish_reason "length"
    empty_reasoning: int = 0
    reasoning_chars: int = 0
    content_chars: int = 0

    def add(self, record: Record) -> None:
        usage = record["usage"]
        turns = generated_turns(record)
        self.completion_tokens.add(int(usage.get("completion_tokens", 0)))
        self.reasoning_tokens += int(usage.get("reasoning_tokens", 0))
        self.at_max_tokens += any(turn.finish_reason == "length" for turn in turns)
        self.empty_reasoning += any(not turn.reasoning for turn in turns)
        self.reasoning_chars += sum(len(turn.reasoning) for turn in turns)
        self.content_chars += sum(len(turn.content) for turn in turns)

    def summary(self) -> dict[str, Any]:
        tokens = self.completion_tokens
        n = tokens.n
        return {
            "records": n,
            "completion_tokens": {
                "min": min(tokens.counts, default=0), "median": tokens.quantile(0.5),
                "mean": round(tokens.mean, 2), "std": round(tokens.std, 2), "p99": tokens.quantile(0.99),
                "max": max(tokens.counts, default=0), "total": tokens.total,
            },
            "at_max_tokens_pct": _pct(self.at_max_tokens, n),
            # Content tokens: completion minus reasoning (so the reasoning end marker and the stop
            # token count as content).
            "reasoning_tokens": self.reasoning_tokens,
            "content_tokens": tokens.total - self.reasoning_tokens,
            "reasoning_token_pct": _pct(self.reasoning_tokens, tokens.total),
            "reasoning_chars": self.reasoning_chars,
            "content_chars": self.content_chars,
            "empty_reasoning_pct": _pct(self.empty_reasoning, n),
        }


class RunStats:
    def __init__(self) -> None:
        self.datasets: dict[str, DatasetStats] = {}

    def add(self, record: Record) -> None:
        stats = self.datasets.get(record["dataset"])
        if stats is None:
            stats = self.datasets[record["dataset"]] = DatasetStats()
        stats.add(record)

    def summary(self) -> dict[str, dict[str, Any]]:
        return {name: self.datasets[name].summary() for name in sorted(self.datasets)}

    def table(self, title: str) -> Table:
        table = Table(title=title)
        for column in ("dataset", "records", "min", "median", "mean", "std", "p99", "max", "% at max",
                       "reasoning %", "content %", "empty reasoning %"):
            table.add_column(column, justify="left" if column == "dataset" else "right")
        for name, row in self.summary().items():
            tokens = row["completion_tokens"]
            reasoning = row["reasoning_token_pct"]
            table.add_row(
                escape(name), f"{row['records']:,}", f"{tokens['min']:,}", f"{tokens['median']:,.1f}",
                f"{tokens['mean']:,.1f}", f"{tokens['std']:,.1f}", f"{tokens['p99']:,.0f}", f"{tokens['max']:,}",
                f"{row['at_max_tokens_pct']:.1f}",
                f"{reasoning:.1f}", f"{100 - reasoning:.1f}" if row["completion_tokens"]["total"] else "0.0",
                f"{row['empty_reasoning_pct']:.1f}",
            )
        return table

    def save_histogram(self, path: Path, title: str) -> bool:
        """A PNG of each dataset's completion-length histogram; False when matplotlib (the
        `plots` extra) is not installed."""
        try:
            import matplotlib
        except ImportError:
            return False
        matplotlib.use("Agg")  # no display on a server
        import matplotlib.pyplot as plt
        import numpy as np

        names = sorted(self.datasets)
        if not names:
            return False
        columns = min(2, len(names))
        rows = math.ceil(len(names) / columns)
        figure, axes = plt.subplots(rows, columns, figsize=(6 * columns, 3.2 * rows), squeeze=False)
        for axis, name in zip(axes.flat, names, strict=False):
            counts = self.datasets[name].completion_tokens.counts
            values = sorted(counts)
            low, high = max(values[0], 1), max(values[-1], 1)
            # Completion lengths are roughly lognormal: a log axis shows the shape and the tail.
            spread = high >= 20 * low
            bins: Any = (np.geomspace(low, high + 1, 40) if spread else min(50, max(1, len(values))))
            axis.hist([max(v, 1) if spread else v for v in values], weights=[counts[v] for v in values],
                      bins=bins, color="#4C72B0")
            if spread:
                axis.set_xscale("log")
            stats = self.datasets[name].summary()
            axis.set_title(f"{name} · n={stats['records']:,} · {stats['at_max_tokens_pct']:.1f}% at max", fontsize=9)
            axis.set_xlabel("completion tokens")
            axis.set_ylabel("records")
        for axis in list(axes.flat)[len(names):]:
            axis.set_visible(False)
        figure.suptitle(title)
        figure.tight_layout()
        figure.savefig(path, dpi=100)
        plt.close(figure)
        return True


def _pct(part: int, whole: int) -> float:
    return round(100 * part / whole, 2) if whole else 0.0
