"""What `status` reads: the snapshot types, the per-minute history and the read of a run from Redis.

What `genfleet status` knows about a run at one moment, as plain frozen data: progress counters
per dataset, throughput per window, completion-length statistics, partitions, upstreams, ETAs.

No Redis here: `read_model` fills these from Redis, `alarms` and `render` only read them, so tests
can build them by hand.

A run's throughput minute by minute over the last hour, for the status page's charts.

Read through `common.fleet_stats.read_rates`, the one reader of the rate buckets: asked for windows of
1, 2, ... 60 minutes ending now, the difference between two consecutive windows is one minute's
worth (`read_rates` spreads a bucket's counts evenly over its elapsed part, so the minutes slide
with now, like the table's "1m" column). One pipelined read of the 61 buckets; the buckets expire
after two hours (`common/keys.py`), so an hour is always there.

Where a run stands, read from Redis: counters per dataset, queue depths, rates over the last 1 and
10 minutes, completion-length histograms, tasks in flight and upstream health from the workers'
beacons, and an ETA per dataset, assembled into a `RunStatus` (`snapshot`). `genfleet status`, the
demo, the tests and the bench read it from here.
"""
from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import redis

from genfleet.common import fleet_stats
from genfleet.common.fleet_stats import LengthHistogram
from genfleet.common.keys import KOMBU_UNACKED, ManifestFields, RunKeys, queue_list
from genfleet.common.queues import PARTITIONS
from genfleet.common.redis_checks import durability_problems
from genfleet.common.redis_clock import WARN_OFFSET_S
from genfleet.common.run_state import RunState
from genfleet.status.eta import DatasetWork, Eta, PoolThroughput, estimate_etas

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
        """Every prompt of the run settled; a run with no dataset (never enqueued here) is not."""
        return bool(self.datasets) and all(d.finished for d in self.datasets)

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
    # The workers' in-flight targets summed (fixed shares or `--in-flight auto`'s; None from workers
    # that predate them), and the host's load as the most recent worker read it.
    target: int | None = None
    load: fleet_stats.ServerLoad | None = None

    @property
    def admission_bound(self) -> bool:
        return self.load is not None and self.load.admission_bound()


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
    # Worker name -> its wall clock's offset from Redis's, where past WARN_OFFSET_S
    skewed_clocks: dict[str, float] = field(default_factory=dict)
    # Live workers that saw this run's state in Redis, which has lost it since
    lost_by: list[str] = field(default_factory=list)
    # Dataset -> prompts neither queued, running, done, dead, rejected nor skipped: their message is
    # lost (found by the workers' check, workers/delivery.py)
    unaccounted: dict[str, int] = field(default_factory=dict)
    # Ways this Redis may lose the run's state (no noeviction, no AOF), or that they could not be checked
    redis_problems: list[str] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.progress.finished


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


WINDOW_NAMES = {60: "1m", 600: "10m"}


def read_progress(client: redis.Redis, run: str) -> RunProgress:
    """The counters alone: cheap enough to poll many times a second."""
    state = RunState(client, run)
    datasets = [DatasetProgress(dataset=name, **state.counters(name)) for name in state.datasets()]
    pipe = client.pipeline(transaction=False)
    for queue in PARTITIONS:
        pipe.llen(queue_list(queue))
    pipe.hlen(KOMBU_UNACKED)
    *depths, unacked = pipe.execute()
    return RunProgress(run, datasets, dict(zip(PARTITIONS, depths, strict=True)), unacked)


def read_status(client: redis.Redis, run: str, now: float | None = None) -> RunStatus:
    beacons_at = now  # None: Redis's clock, which the workers stamp their beacons with
    now = time.time() if now is None else now
    progress = read_progress(client, run)
    names = [d.dataset for d in progress.datasets]
    created = client.hget(RunKeys(run).manifest, ManifestFields.CREATED_AT)
    created_at = float(created) if created else None
    first, last = fleet_stats.read_activity(client, run)
    window_counts = fleet_stats.read_rates(client, run, since=created_at if created_at else first, now=now)
    histograms = fleet_stats.read_lengths(client, run, names)
    partition_done = fleet_stats.read_partition_done(client, run)
    live = fleet_stats.read_beacons(client, beacons_at)

    in_flight: dict[tuple[str, str], int] = defaultdict(int)
    for beacon in live:
        for key, count in beacon.run_in_flight(run).items():
            in_flight[key] += count

    datasets = _dataset_rows(progress, window_counts, histograms, partition_done, in_flight)
    partitions = [_partition_row(p, progress, window_counts, in_flight, live) for p in PARTITIONS]
    pending = progress.totals().pending  # beacons lag the counters by a couple of seconds
    partitions = [replace(p, in_flight=min(p.in_flight, pending)) for p in partitions]
    datasets = _with_etas(datasets, histograms, partitions, window_counts, partition_done, in_flight)
    return RunStatus(
        run=run, time=now, progress=progress, datasets=datasets, partitions=partitions,
        upstreams=_upstreams(live), workers=len(live), created_at=created_at, first_finished=first,
        last_finished=last, totals=_totals(progress, datasets, window_counts, histograms),
        disk_problems=[f"{b.name}: {b.disk_problem}" for b in live if b.disk_problem],
        lost_by=[b.name for b in live if run in b.lost_runs],
        skewed_clocks={b.name: b.clock_offset_s for b in live
                       if b.clock_offset_s is not None and abs(b.clock_offset_s) >= WARN_OFFSET_S},
        unaccounted=RunState(client, run).unaccounted(),
        redis_problems=durability_problems(client),
    )


def _window_sum(window_counts: fleet_stats.Rates, keep: Callable[[str, str], bool]) -> dict[str, Throughput]:
    """Throughput per window over the (dataset, partition) pairs `keep` accepts."""
    out = {}
    for window, name in WINDOW_NAMES.items():
        total: fleet_stats.WindowCounts | None = None
        for key, per_window in window_counts.items():
            counts = per_window.get(window)
            if counts is None or not keep(*key):
                continue
            total = counts if total is None else total.plus(counts)
        out[name] = Throughput.of(total)
    return out


def _dataset_rows(progress: RunProgress, window_counts: fleet_stats.Rates, histograms: dict[str, LengthHistogram],
                  partition_done: dict[tuple[str, str], int],
                  in_flight: dict[tuple[str, str], int]) -> list[DatasetStatus]:
    rows = []
    for d in progress.datasets:
        histogram = histograms.get(d.dataset, LengthHistogram())
        rows.append(DatasetStatus(
            progress=d,
            done_by_partition={p: partition_done[(d.dataset, p)] for p in PARTITIONS
                               if partition_done.get((d.dataset, p))},
            # Beacons are up to a couple of seconds older than the counters: never more than pending.
            in_flight=min(sum(n for (dataset, _), n in in_flight.items() if dataset == d.dataset), d.pending),
            rates=_window_sum(window_counts, lambda dataset, _p: dataset == d.dataset),  # noqa: B023 - called at once
            lengths=LengthStats.of(histogram, d.completion_tokens / d.done if d.done else None),
            eta=None,
        ))
    return rows


def _partition_row(partition: str, progress: RunProgress, window_counts: fleet_stats.Rates,
                   in_flight: dict[tuple[str, str], int], live: list[fleet_stats.WorkerBeacon]) -> PartitionStatus:
    pool = [b for b in live if b.pool == partition]
    return PartitionStatus(
        partition=partition, queued=progress.queued.get(partition, 0),
        in_flight=sum(n for (_, p), n in in_flight.items() if p == partition),
        slots=sum(b.slots for b in pool), workers=len(pool),
        rates=_window_sum(window_counts, lambda _d, p: p == partition),
    )


def _with_etas(rows: list[DatasetStatus], histograms: dict[str, LengthHistogram],
               partitions: list[PartitionStatus], window_counts: fleet_stats.Rates,
               partition_done: dict[tuple[str, str], int],
               in_flight: dict[tuple[str, str], int]) -> list[DatasetStatus]:
    pools = {p.partition: PoolThroughput(p.rates["1m"].tok_per_s, p.rates["10m"].tok_per_s, p.in_flight,
                                         p.rates["10m"].stream_tok_s) for p in partitions}
    fleet_mix: dict[str, float] = defaultdict(float)
    for (_, partition), count in partition_done.items():
        fleet_mix[partition] += count
    work = []
    for row in rows:
        served: dict[str, float] = {}
        for partition in PARTITIONS:
            key = (row.name, partition)
            recent = window_counts.get(key, {})
            # Being served now: tasks in flight there, or prompts finished there in the last minute.
            if in_flight.get(key) or (recent.get(60) and recent[60].requests > 0):
                ten = recent.get(600)
                served[partition] = ten.tok_per_s if ten and ten.tok_per_s > 0 else 1.0
        work.append(DatasetWork(
            name=row.name, remaining=row.progress.pending, lengths=histograms.get(row.name, LengthHistogram()),
            mean_tokens=row.lengths.mean if row.progress.done else None, in_flight=row.in_flight,
            served_tok_s=served,
            partition_mix={p: float(n) for p, n in row.done_by_partition.items()},
        ))
    etas = estimate_etas(work, pools, fleet_mix=fleet_mix)
    return [DatasetStatus(row.progress, row.done_by_partition, row.in_flight, row.rates, row.lengths,
                          etas.get(row.name)) for row in rows]


def _totals(progress: RunProgress, rows: list[DatasetStatus], window_counts: fleet_stats.Rates,
            histograms: dict[str, LengthHistogram]) -> DatasetStatus:
    totals = progress.totals()
    merged = LengthHistogram()
    for histogram in histograms.values():
        merged = merged.merged(histogram)
    done_by_partition: dict[str, int] = defaultdict(int)
    for row in rows:
        for partition, count in row.done_by_partition.items():
            done_by_partition[partition] += count
    etas = [row.eta for row in rows]
    eta = None
    if etas and all(e is not None for e in etas):
        known = [e for e in etas if e is not None]
        # The run ends with its last dataset; it rests on fleet lengths if any dataset does.
        basis = "fleet" if any(e.basis == "fleet" for e in known) else "own"
        eta = Eta(max(e.low_s for e in known), max(e.expected_s for e in known), max(e.high_s for e in known),
                  basis, merged.samples)
    return DatasetStatus(
        progress=totals, done_by_partition=dict(done_by_partition), in_flight=sum(r.in_flight for r in rows),
        rates=_window_sum(window_counts, lambda _d, _p: True),
        lengths=LengthStats.of(merged, totals.completion_tokens / totals.done if totals.done else None), eta=eta,
    )


def _upstreams(live: list[fleet_stats.WorkerBeacon]) -> list[UpstreamStatus]:
    seen: dict[str, UpstreamStatus] = {}
    for beacon in sorted(live, key=lambda b: b.time):  # the latest reading of a host's load wins
        for upstream in beacon.upstreams:
            was = seen.get(upstream.url, UpstreamStatus(upstream.url, 0, 0, 0))
            target = None if upstream.target is None and was.target is None else (
                (was.target or 0) + (upstream.target if upstream.target is not None else upstream.in_flight))
            seen[upstream.url] = UpstreamStatus(
                upstream.url, was.workers + 1, was.down_in + (not upstream.healthy), was.in_flight + upstream.in_flight,
                target=target, load=upstream.load or was.load)
    return [seen[url] for url in sorted(seen)]
