"""What the fleet reports about itself, written by workers and read by `status`: completion-length
histograms, per-minute rates and worker beacons.

Completion lengths as a compact log-spaced histogram: a few hundred bytes per dataset in Redis,
whatever the dataset's size, yet quantiles within ~5% of the exact ones.

Bucket 0 holds empty completions; bucket i >= 1 holds lengths in [2**((i-1)/8), 2**(i/8)), so each
bucket is ~9% wide and a million-token completion lands in bucket 160.

Live statistics of a run: per-minute rate buckets (prompts, tokens, request seconds, failed
attempts per dataset and partition), completion-length histograms and when the run last made progress.

Workers write a finished prompt's in the script that settles its row (`completion_updates`, applied
by `RunState.mark_done`: once per row, no extra round trip) and a failed attempt's with one pipelined
round trip (`record_failure`); `genfleet status` reads them (`read_rates`, `read_lengths`).
Memory stays bounded: rate buckets expire after two hours, histograms are a few hundred bytes.

Worker beacons: every few seconds each worker publishes, with a short TTL, what only it knows:
the health of its upstreams (circuit open or closed), with `--in-flight auto` its target for each
and the host's last load reading, its tasks in flight per run, dataset and partition, and the
first caps it asks (`--first-max-new-tokens auto`). `genfleet status` reads the live ones; a dead
worker's beacon simply expires.
"""
from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import redis

from genfleet.common.keys import RATE_BUCKET_TTL_S, WORKER_BEACONS, RunKeys, worker_beacon
from genfleet.common.redis_clock import clock_for

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


# One write of a settled row besides its counters: (command, key, field, value), a length bucket's
# field its index; see common/mark_done.lua for the commands it takes.
KeyUpdate = tuple[str, str, str | int, int | float | str]

# The windows `status` shows: last minute and last ten minutes.
WINDOWS_S = (60, 600)
_BUCKET_S = 60


def completion_updates(run: str, dataset: str, partition: str, completion_tokens: int, seconds: float = 0.0,
                       now: float | None = None) -> list[KeyUpdate]:
    """What a finished prompt adds: to this minute's rate bucket, the length histogram, the
    partition's done count and the run's activity, as (command, key, field, value). Workers apply
    them in the script that sets the row's done bit (`RunState.mark_done`): once per row, in the
    same round trip. `seconds` is how long its requests ran (for one stream's decode speed)."""
    now = time.time() if now is None else now
    keys = RunKeys(run)
    bucket = keys.rate_bucket(int(now // _BUCKET_S))
    updates: list[KeyUpdate] = [
        ("HINCRBY", bucket, _field("req", partition, dataset), 1),
        ("HINCRBY", bucket, _field("tok", partition, dataset), completion_tokens),
    ]
    if seconds > 0:
        updates.append(("HINCRBYFLOAT", bucket, _field("sec", partition, dataset), round(seconds, 3)))
    return updates + [
        ("EXPIRE", bucket, "", RATE_BUCKET_TTL_S),
        ("HINCRBY", keys.lengths(dataset), bucket_of(completion_tokens), 1),
        ("HINCRBY", keys.partition_done, f"{partition}:{dataset}", 1),
        ("HSETNX", keys.activity, "first", now),
        ("HSET", keys.activity, "last", now),
    ]


def record_failure(client: redis.Redis, run: str, dataset: str, partition: str, now: float | None = None) -> None:
    """A failed attempt, retried or not: feeds the error-rate alarm."""
    now = time.time() if now is None else now
    bucket = RunKeys(run).rate_bucket(int(now // _BUCKET_S))
    pipe = client.pipeline(transaction=False)
    pipe.hincrby(bucket, _field("err", partition, dataset), 1)
    pipe.expire(bucket, RATE_BUCKET_TTL_S)
    pipe.execute()


@dataclass(frozen=True)
class WindowCounts:
    """What finished in a window, and the seconds it spans (less than asked early in a run)."""
    seconds: float
    requests: float = 0.0
    tokens: float = 0.0
    errors: float = 0.0
    request_seconds: float = 0.0  # how long the finished prompts' requests ran, summed

    @property
    def stream_tok_s(self) -> float:
        """Decode speed of one stream: tokens per second of request time."""
        return self.tokens / self.request_seconds if self.request_seconds > 0 else 0.0

    @property
    def req_per_min(self) -> float:
        return 60 * self.requests / self.seconds if self.seconds > 0 else 0.0

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def error_share(self) -> float | None:
        """Failed attempts over all attempts that ended in the window."""
        attempts = self.requests + self.errors
        return self.errors / attempts if attempts else None

    def plus(self, other: WindowCounts) -> WindowCounts:
        return WindowCounts(self.seconds, self.requests + other.requests, self.tokens + other.tokens,
                            self.errors + other.errors, self.request_seconds + other.request_seconds)


# (dataset, partition) -> window seconds -> counts
Rates = dict[tuple[str, str], dict[int, WindowCounts]]


def read_rates(client: redis.Redis, run: str, *, since: float | None, now: float | None = None,
               windows: Iterable[int] = WINDOWS_S) -> Rates:
    """Counts per dataset and partition over each window ending now. `since` (the run's start) caps
    a window's span, so a run two minutes old is not averaged over ten."""
    now = time.time() if now is None else now
    windows = tuple(windows)
    keys = RunKeys(run)
    current = int(now // _BUCKET_S)
    oldest = int((now - max(windows)) // _BUCKET_S)
    minutes = list(range(oldest, current + 1))
    pipe = client.pipeline(transaction=False)
    for minute in minutes:
        pipe.hgetall(keys.rate_bucket(minute))
    buckets = dict(zip(minutes, pipe.execute(), strict=True))

    rates: Rates = {}
    for window in windows:
        start = now - window
        span = min(window, now - since) if since is not None else window
        for minute, raw in buckets.items():
            weight = window_weight(minute, start, now)
            if weight <= 0:
                continue
            for key, value in raw.items():
                metric, partition, dataset = _parse_field(key)
                slot = rates.setdefault((dataset, partition), {})
                counts = slot.get(window, WindowCounts(max(span, 1.0)))
                slot[window] = counts.plus(_counts(metric, weight * float(value)))
    return rates


def window_weight(minute: int, start: float, now: float) -> float:
    """Share of a minute bucket's events that fall after `start`, assuming they are spread evenly
    over the part of the minute that has elapsed by `now`."""
    bucket_start, bucket_end = minute * _BUCKET_S, min((minute + 1) * _BUCKET_S, now)
    elapsed = bucket_end - bucket_start
    if elapsed <= 0:
        return 0.0
    return max(0.0, min(1.0, (bucket_end - max(bucket_start, start)) / elapsed))


def read_lengths(client: redis.Redis, run: str, datasets: list[str]) -> dict[str, LengthHistogram]:
    keys = RunKeys(run)
    pipe = client.pipeline(transaction=False)
    for dataset in datasets:
        pipe.hgetall(keys.lengths(dataset))
    return {dataset: LengthHistogram.from_redis(raw) for dataset, raw in zip(datasets, pipe.execute(), strict=True)}


def read_partition_done(client: redis.Redis, run: str) -> dict[tuple[str, str], int]:
    """(dataset, partition) -> prompts finished there."""
    out = {}
    for key, value in client.hgetall(RunKeys(run).partition_done).items():
        partition, _, dataset = _text(key).partition(":")
        out[(dataset, partition)] = int(value)
    return out


def read_activity(client: redis.Redis, run: str) -> tuple[float | None, float | None]:
    """(first, last) unix time a prompt of the run finished."""
    first, last = client.hmget(RunKeys(run).activity, "first", "last")
    return (float(first) if first else None), (float(last) if last else None)


def _field(metric: str, partition: str, dataset: str) -> str:
    # Partition names have no ':'; dataset names may, so the dataset goes last.
    return f"{metric}:{partition}:{dataset}"


def _parse_field(key: bytes | str) -> tuple[str, str, str]:
    metric, partition, dataset = _text(key).split(":", 2)
    return metric, partition, dataset


def _counts(metric: str, amount: float) -> WindowCounts:
    return WindowCounts(0.0, requests=amount if metric == "req" else 0.0,
                        tokens=amount if metric == "tok" else 0.0, errors=amount if metric == "err" else 0.0,
                        request_seconds=amount if metric == "sec" else 0.0)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# Often enough that `status` shows in-flight counts close to the counters it reads fresh: one small
# SET per worker every 2 s is nothing for Redis even at a hundred workers.
BEACON_INTERVAL_S = 2.0
BEACON_TTL_S = 10.0
# Names of workers silent this long are dropped from the index (their beacon expired long ago).
_FORGET_AFTER_S = 86400.0


# The server kinds, as a load names its reader (workers/servers/kinds.py tells an upstream's kind).
SGLANG, VLLM = "sglang", "vllm"


@dataclass(frozen=True)
class ServerLoad:
    """One reading of a host's load, summed over its data-parallel ranks (each server kind reads its
    own page into it: workers/servers/): what `--in-flight auto` steers by (workers/admission.py),
    and what the beacon carries to `status`."""
    running: int
    waiting: int
    token_usage: float
    retracted: int
    gen_throughput: float
    max_total_tokens: int | None = None
    # The server's cap on running requests (SGLang reports it; vLLM's is inferred, servers/vllm.py),
    # and the kind that read this load (SGLANG, VLLM): what common/server_limits.py judges by.
    max_running: int | None = None
    server: str = ""

    def wanted_waiting(self) -> int:
        return wanted_waiting(self.running)

    def at_running_cap(self) -> bool:
        """Running at the server's cap: SGLang's reported one exactly; vLLM's, inferred from its
        pages, within `running_cap_slack` of it (a page read between two steps)."""
        cap = self.max_running or 0
        slack = running_cap_slack(cap) if self.server == VLLM else 0
        return cap > 0 and self.running > 0 and self.running >= cap - slack

    def admission_bound(self) -> bool:
        """Many requests wait while most of the KV cache is free, below the server's running cap:
        the scheduler reserves KV for each request's max_new_tokens (workers/generation/first_cap.py)
        and admits no more. At the cap it is the cap that holds them (common/server_limits.py)."""
        return self.waiting > 2 * self.wanted_waiting() and self.token_usage < 0.5 and not self.at_running_cap()


def running_cap_slack(cap: int) -> int:
    """How far below its `--max-num-seqs` a vLLM server held by that cap may read: it counts a
    finished request out before the next step admits its replacement (0.32.0
    `v1/core/sched/scheduler.py`: `update_from_output` frees it, then `make_stats` counts the
    running), so a page read between two steps shows the cap less that step's finishes. At
    `--max-num-seqs 8` with short replies its running read 7 as often as 8 and no alarm came, and at
    16 it read 14 (bench/results.md section 14, at 866b673 and bdbbd4c). An eighth of the cap, at
    least one. SGLang reports its cap, and is judged by it exactly."""
    return max(1, cap // 8)


def wanted_waiting(running: int) -> int:
    """The waiting queue `--in-flight auto` keeps: a few, 5% of those running (workers/admission.py)."""
    return max(2, math.ceil(0.05 * running))



@dataclass(frozen=True)
class UpstreamHealth:
    url: str
    healthy: bool  # circuit closed: the worker sends it traffic
    in_flight: int
    # This worker's cap for the host (its fixed share, or `--in-flight auto`'s target), and the
    # host's last `/v1/loads` reading (None where it has none).
    target: int | None = None
    load: ServerLoad | None = None


@dataclass(frozen=True)
class WorkerBeacon:
    name: str
    pool: str
    slots: int
    time: float
    upstreams: list[UpstreamHealth] = field(default_factory=list)
    # run -> "partition:dataset" -> tasks executing now
    in_flight: dict[str, dict[str, int]] = field(default_factory=dict)
    # Why this worker cannot write its shards now (disk full, write errors), or None.
    disk_problem: str | None = None
    # run -> dataset -> the first cap this worker's `--first-max-new-tokens auto` asks now.
    first_caps: dict[str, dict[str, int]] = field(default_factory=dict)
    # This host's wall clock against Redis's (positive: behind; common/redis_clock.py), or None.
    clock_offset_s: float | None = None
    # Runs whose state this worker saw in Redis and Redis has lost since (workers/telemetry.py).
    lost_runs: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: bytes | str) -> WorkerBeacon:
        """A beacon, of this version or another: fields a newer worker added are left out, so a
        fleet upgraded host by host keeps its `status` (a missing field takes its default)."""
        raw = json.loads(text)
        raw["upstreams"] = [UpstreamHealth(**{**_known(UpstreamHealth, u),
                                              "load": ServerLoad(**_known(ServerLoad, u["load"])) if u.get("load")
                                              else None})
                            for u in raw.get("upstreams", [])]
        return cls(**_known(cls, raw))

    def run_in_flight(self, run: str) -> dict[tuple[str, str], int]:
        """(dataset, partition) -> tasks of `run` executing on this worker."""
        out = {}
        for key, count in self.in_flight.get(run, {}).items():
            partition, _, dataset = key.partition(":")
            out[(dataset, partition)] = count
        return out


def _known(kind: type, raw: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(kind)}
    return {name: value for name, value in raw.items() if name in names}


def publish(client: redis.Redis, beacon: WorkerBeacon, ttl_s: float = BEACON_TTL_S) -> None:
    pipe = client.pipeline(transaction=False)
    pipe.set(worker_beacon(beacon.name), beacon.to_json(), px=int(ttl_s * 1000))
    pipe.zadd(WORKER_BEACONS, {beacon.name: beacon.time})
    pipe.execute()


def withdraw(client: redis.Redis, name: str) -> None:
    """On a clean shutdown: the worker stops counting as live at once."""
    pipe = client.pipeline(transaction=False)
    pipe.delete(worker_beacon(name))
    pipe.zrem(WORKER_BEACONS, name)
    pipe.execute()


def streams_to(client: redis.Redis, *, besides: str) -> dict[str, int]:
    """The live workers' streams open per upstream URL, but for the worker named `besides`: what
    `--in-flight auto` adds to its own to know the pipe to a host (workers/admission.py)."""
    counts: dict[str, int] = {}
    for beacon in read_beacons(client):
        if beacon.name != besides:
            for upstream in beacon.upstreams:
                counts[upstream.url] = counts.get(upstream.url, 0) + upstream.in_flight
    return counts


def read_beacons(client: redis.Redis, now: float | None = None) -> list[WorkerBeacon]:
    """The live workers' beacons. Their times are Redis's clock (workers/telemetry.py stamps them
    with it), so a worker on a skewed host is neither dropped nor kept past its time."""
    now = clock_for(client).now() if now is None else now
    client.zremrangebyscore(WORKER_BEACONS, 0, now - _FORGET_AFTER_S)
    names = [n.decode() if isinstance(n, bytes) else n
             for n in client.zrangebyscore(WORKER_BEACONS, now - BEACON_TTL_S, "+inf")]
    if not names:
        return []
    raw = client.mget([worker_beacon(name) for name in names])
    return sorted((WorkerBeacon.from_json(text) for text in raw if text), key=lambda b: b.name)
