"""What `genfleet status` knows about a run at one moment, as plain frozen data: progress counters
per dataset, throughput per window, completion-length statistics, partitions, upstreams, ETAs.

No Redis here: `read_model` fills these from Redis, `alarms` and `render` only read them, so tests
can build them by hand.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from genfleet.common.fleet_stats import LengthHistogram
from genfleet.status.eta import Eta

if TYPE_CHECKING:
    from genfleet.common.fleet_stats import WindowCounts


@dataclass(frozen=True)
class DatasetProgress:
    dataset: str
    total: int
    done: int
    failed: int
    rejected: int
    skipped: int
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    truncated: int
    empty_reasoning: int
    empty_content: int
    aborted: int
    integrity: int
    # Newer counters (the loop guard, truncation handling): 0 where a run predates them, and
    # defaulted so a progress built by hand without them still reads.
    looped: int = 0
    looped_tokens: int = 0  # completion tokens the looped completions cost
    continued: int = 0
    regenerated: int = 0

    @property
    def pending(self) -> int:
        return max(self.total - self.done - self.failed - self.skipped, 0)

    @property
    def finished(self) -> bool:
        return self.pending == 0


@dataclass(frozen=True)
class RunProgress:
    run: str
    datasets: list[DatasetProgress]
    queued: dict[str, int]  # messages waiting per queue (all runs share the queues)
    unacked: int  # messages delivered to workers, not yet acknowledged

    @property
    def finished(self) -> bool:
        return all(d.finished for d in self.datasets)

    def totals(self) -> DatasetProgress:
        fields = {name: sum(getattr(d, name) for d in self.datasets)
                  for name in DatasetProgress.__dataclass_fields__ if name != "dataset"}
        return DatasetProgress(dataset="all", **fields)


@dataclass(frozen=True)
class Throughput:
    req_per_min: float
    tok_per_s: float
    stream_tok_s: float  # one request's decode speed (tokens per second of request time)
    requests: float  # prompts finished in the window
    errors: float  # failed attempts in the window
    error_share: float | None  # of all attempts that ended in the window

    @classmethod
    def of(cls, counts: WindowCounts | None) -> Throughput:
        if counts is None:
            return cls(0.0, 0.0, 0.0, 0.0, 0.0, None)
        return cls(counts.req_per_min, counts.tok_per_s, counts.stream_tok_s, counts.requests, counts.errors,
                   counts.error_share)


@dataclass(frozen=True)
class LengthStats:
    samples: int
    median: float | None
    mean: float | None  # exact (token counters) where the counters allow
    p99: float | None

    @classmethod
    def of(cls, histogram: LengthHistogram, exact_mean: float | None = None) -> LengthStats:
        return cls(histogram.samples, histogram.quantile(0.5),
                   exact_mean if exact_mean is not None else histogram.mean(), histogram.quantile(0.99))


@dataclass(frozen=True)
class DatasetStatus:
    progress: DatasetProgress
    done_by_partition: dict[str, int]
    in_flight: int
    rates: dict[str, Throughput]  # window name ("1m", "10m") -> throughput
    lengths: LengthStats
    eta: Eta | None

    @property
    def name(self) -> str:
        return self.progress.dataset


@dataclass(frozen=True)
class PartitionStatus:
    partition: str
    queued: int  # messages waiting in its queue (all runs)
    in_flight: int  # this run's tasks executing on its workers
    slots: int  # task slots of its live workers
    workers: int
    rates: dict[str, Throughput]


@dataclass(frozen=True)
class UpstreamStatus:
    url: str
    workers: int  # live workers routing to it
    down_in: int  # of those, how many have its circuit open
    in_flight: int


@dataclass(frozen=True)
class RunStatus:
    run: str
    time: float
    progress: RunProgress
    datasets: list[DatasetStatus]
    partitions: list[PartitionStatus]
    upstreams: list[UpstreamStatus]
    workers: int  # live workers (fresh beacon), any run
    created_at: float | None  # first enqueue
    first_finished: float | None
    last_finished: float | None
    totals: DatasetStatus = field(repr=False)
    # "worker: problem" for each live worker that cannot write its shards
    disk_problems: list[str] = field(default_factory=list)
    # Dataset -> prompts neither queued, running, done, dead, rejected nor skipped: their message is
    # lost (found by the workers' check, workers/delivery.py)
    unaccounted: dict[str, int] = field(default_factory=dict)
    # Ways this Redis may lose the run's state (no noeviction, no AOF), or that they could not be checked
    redis_problems: list[str] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.progress.finished
