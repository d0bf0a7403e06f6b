"""`--in-flight auto`: each host's open streams follow the host's own load.

A fixed in-flight count is a guess about the server. SGLang queues what it cannot admit instead of
refusing it (its waiting queue, `managers/scheduler.py`), so a count above what its KV cache admits
only lengthens that queue (every request's time to first token), and a count below it leaves
decode batch, and tok/s, unused. The server reports both sides: `/v1/loads` (0.5.23
`entrypoints/v1_loads.py`, built by `managers/scheduler_components/load_inquirer.py::get_loads`)
gives per data-parallel rank `num_running_reqs`, `num_waiting_reqs`, `token_usage` (KV in use ÷
capacity), `gen_throughput` (decode tok/s over its last log interval), `max_total_num_tokens` and
`queues.retracted` (requests retracted at the last retraction: the KV ran out mid-decode, and
their decoded tokens are computed again). vLLM's `/metrics` gives the same, read into the same
`ServerLoad` (workers/servers/vllm.py `LoadMeter`: its counters of preemptions and generated tokens
become those since the reading before, and a tok/s over the time between).

The rule, per host, every `admission_interval_s`:
- a waiting queue above twice the wanted one: at least `wanted_waiting` (a few requests, 5% of
  those running), and no fewer than the fleet's requests in the pipe to the host (`in_transit`).
  The queue is to be short, never empty, so that the scheduler refills a finished request's slot
  at once; the requests the host finishes while their replacements travel to it are what the
  queue must cover, and by Little's law that is the number in the pipe. So: lower the target to
  this worker's streams less half the excess over the wanted queue, weighted
  by its share of what the server holds. Between once and twice it: hold. (Decreases start from
  the streams open, not from the last target: lowering a target closes no stream, so the readings
  until the streams drain would otherwise lower it again and again, down to one.)
- retractions or preemptions (the KV cache ran out mid-decode), with no long queue: hold. The
  server sheds that load itself: SGLang sets its new_token_ratio from the retraction and admits
  less (0.5.23 `managers/scheduler.py`, after `batch.retract_decode()`), and vLLM puts the request
  it preempts back in its waiting queue and admits nothing more in that step (0.32.0
  `v1/core/sched/scheduler.py` `schedule`, `_preempt_request`). What the client's count decides is
  only the queue: a raise would lengthen it, and a cut below it, which this rule once made (to four
  fifths of the streams), starves the batch. On vLLM's own server (bench/results.md section 14 at
  79927d7) the seeds' lengths preempted at every fixed count alike (27 at 32 in flight, 28 at 400);
  on short chat with its KV cache limited no fixed count preempted and auto did 6 times, and its
  cuts left 35 running where fixed 128 ran 42 with 13 waiting (0.88× its tok/s; 0.99× held, at
  866b673). SGLang's `queues.retracted` is the count at its last stats log and is reset by the
  next (0.5.23 `scheduler_components/metrics_reporter.py`), so a hold lasts about one log interval.
- a waiting queue below it, and this worker filling its target: raise the target, by a quarter
  when nothing waits (doubled while the KV cache is less than half in use: a raise can only
  overfill a host by queueing, which the next reading shows, or by running its KV out, which is
  far off then), else by half the shortfall (weighted by the share), while the raises still raise
  the host's tok/s: the raises of `FLAT_RAISES` readings that report a tok/s are judged together,
  and when together they did not lift it by `MIN_GAIN`, the target goes back to where they started
  and holds for `HOLD_S`, then tries again (the host's shape may have changed). They are judged only while this
  worker fills its target: a run running out of prompts lowers the host's tok/s by itself.
  Together, because SGLang's tok/s is the mean over its last log interval, which a reading just
  after a raise does not yet hold, and is 0 until its first interval ends: judged one by one
  against that, the first three raises of a run looked flat on SGLang's own scheduler, and the
  target stalled at 31 for a minute on a host with room for 400 (bench/results.md, section 10).
- never above the ceiling (`--concurrency` split over the hosts: an operator raises it there),
  never below 1.

Several workers share a host, and the server's counts are their sum. Each worker moves its own
target by its share of the correction (or by the same factor, for the multiplicative steps), so
the sum moves as one worker's would, whatever the number of workers: they converge to the same
combined target (tests/unit/test_admission.py simulates it). The one thing a worker takes from the
others is their streams open to the host, from their beacons (`fleet_stats.streams_to`, at most a
beacon interval old): the pipe is the fleet's streams less what the server holds, and without the
others' a worker would take its share of what the server holds for its own pipe.

A host without `/v1/loads` (an older SGLang, a router, a proxy: a 404, or `UNREADABLE_READINGS`
answers in a row that are not a load) keeps the fixed share, said once in the log and by
`genfleet doctor`. A worker with no stream open to a host leaves its target as it is: the server's
counts are other workers' then.

Where a target starts: the pool's fixed share (150 short, 32 long per host; less where the ceiling
is lower), and there again when a host that went down comes back (its cache, and perhaps its shape,
are new). From the defaults, `auto` moves only where a reading says the host wants it: down on a
host whose KV cache admits fewer, up on one with room. A start below them cost every run a ramp of
ten readings (20 s) and, judged by a tok/s the server had not reported yet, a minute held at 31
on a host with room for 400 (bench/results.md, section 10, at 48a2b91).
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import redis

from genfleet.common.fleet_stats import ServerLoad
from genfleet.workers.servers.api import LoadProblem, ServerApi
from genfleet.workers.upstreams import UpstreamPool

log = logging.getLogger(__name__)

RAISE_FACTOR = 1.25
# Nothing waiting and the KV cache less than this full: raise by ROOMY_RAISE_FACTOR instead.
ROOMY_USAGE = 0.5
ROOMY_RAISE_FACTOR = 2.0
EXCESS_GAIN = 0.5
# Raises that did not lift the host's tok/s by this fraction, FLAT_RAISES readings after the first
# of them, count as flat.
MIN_GAIN = 0.02
FLAT_RAISES = 3
HOLD_S = 60.0
# The pipe is taken as the least of this many readings: a raise's new requests are in it until they
# reach the server, and read then they would ask for a longer queue, and a raise, again.
PIPE_READINGS = 3
# Readings in a row without a usable answer (not a 404: an error page, a timeout, another schema)
# after which `auto` gives a host up and keeps its fixed share.
UNREADABLE_READINGS = 5


@dataclass
class HostAdmission:
    """One host's target and what it was decided on."""
    target: float
    mode: str = "auto"  # "auto", or "fixed" when the host does not report its load
    load: ServerLoad | None = None
    raised_from_tps: float | None = None  # the host's tok/s before the raises being judged
    raised_from_target: float = 0.0  # and the target then
    readings: int = 0  # readings since then
    hold_until: float = 0.0
    unreadable: int = 0  # readings in a row that gave nothing usable
    # The fleet's requests in the pipe to the host at the last readings (in_transit): the least is used.
    pipe: deque[int] = field(default_factory=lambda: deque(maxlen=PIPE_READINGS))


def next_target(host: HostAdmission, load: ServerLoad, *, mine: int, ceiling: int, now: float,
                others: int = 0) -> float:
    """The host's next target for this worker, from its reading `load`; `mine`: this worker's
    streams open to it now, `others`: the other workers' (their beacons). A float: each worker's
    share of a correction is a fraction of a stream, and rounding each step would make the sum
    depend on the number of workers."""
    target = host.target
    filling = mine >= 0.9 * math.floor(target)
    # A reading without a tok/s says nothing of the raises: SGLang reports 0 until the first log
    # interval after a (re)start ends. Judged by it, they looked flat, were taken back and held for a
    # minute (the simulator's figure is 0 while a prefill batch runs, so it showed in CI too).
    if host.raised_from_tps is not None and load.gen_throughput > 0:
        host.readings += 1
        if host.readings >= FLAT_RAISES:
            # Judge the last raises together, by what they did to tok/s: SGLang's figure is the tokens
            # of its last log interval (40 decode steps: 0.5.23 `managers/scheduler_components/
            # metrics_reporter.py`), so a reading just after a raise does not show it yet. Streams that
            # add no tok/s only slow every other stream down: back to where the raises started.
            # Only while this worker fills its target: one whose run has run out of prompts sees the
            # host's tok/s fall as its last streams finish, which says nothing of the raise (taken
            # back on that, the next run's prompts met the lower target, held for a minute).
            if filling and load.gen_throughput <= host.raised_from_tps * (1 + MIN_GAIN):
                target = min(target, host.raised_from_target)
                host.hold_until = now + HOLD_S
            host.raised_from_tps = None
    held = load.running + load.waiting
    share = min(mine / held, 1.0) if held > 0 else 1.0
    if mine > 0:
        host.pipe.append(in_transit(load, mine + others))
    wanted = max(load.wanted_waiting(), min(host.pipe, default=0))
    # A lowered target closes no stream: the host sees fewer only as streams finish, seconds later.
    # So a decrease is taken from the streams open now, not from the last target: readings taken
    # before the streams drain ask for the same target again instead of lowering it once more each.
    if mine == 0:
        pass  # no stream of this worker's is in the server's counts: its target is not what they say
    elif load.waiting > 2 * wanted:
        target = min(target, mine - share * (load.waiting - wanted) * EXCESS_GAIN)
    elif load.retracted > 0:
        pass  # the server sheds what its KV cache could not hold: the batch is its own (see above)
    elif load.waiting < wanted and filling and now >= host.hold_until and target < ceiling:
        # A host that reports no tok/s yet (SGLang's first log interval has not ended) has nothing
        # to judge a raise by: judged against 0, the first raises of every run looked flat.
        if host.raised_from_tps is None and load.gen_throughput > 0:
            host.raised_from_tps, host.raised_from_target, host.readings = load.gen_throughput, target, 0
        if load.waiting == 0:  # room, perhaps much: a quarter more, or twice (at least a stream in all)
            factor = ROOMY_RAISE_FACTOR if load.token_usage < ROOMY_USAGE else RAISE_FACTOR
            target = max(target * factor, target + share)
        else:
            target += share * (wanted - load.waiting) * EXCESS_GAIN
    return max(1.0, min(target, float(ceiling)))


def in_transit(load: ServerLoad, streams_open: int) -> int:
    """The fleet's requests to the host that the server does not count, of `streams_open`: sent and
    not yet in its queue (the HTTP request, the server's tokenizer process, its scheduler's next
    receive), or finished and their stream not yet closed. At a steady state that is the host's
    finishes during one refill (Little's law), what its waiting queue must hold for no freed slot
    to stand empty while the replacements travel."""
    return max(0, streams_open - load.running - load.waiting)


def streams(target: float) -> int:
    """The cap a target gives: whole streams, at least one."""
    return max(1, math.floor(target + 0.5))


class AdmissionControl:
    """A thread that reads each healthy host's load, for `status` and the metrics, and with
    `steer` (`--in-flight auto`) sets the host's cap in the upstream pool from it. Without `steer`
    each host keeps its fixed share: the readings still show when a host is admission-bound, which
    is what tells an operator on the defaults to try the other modes."""

    def __init__(self, pool: UpstreamPool, server: ServerApi, *, ceiling: int, interval_s: float, steer: bool,
                 start: int, others: Callable[[], Mapping[str, int]] = dict) -> None:
        self.pool = pool
        self.server = server
        self.others = others  # the other workers' streams open per host (their beacons)
        self.ceiling = ceiling
        self.interval_s = interval_s
        self.start = min(start, ceiling) if steer else ceiling
        mode = "auto" if steer else "fixed"
        self.hosts = {url: HostAdmission(target=self.start, mode=mode) for url in pool.urls}
        self._unreadable: set[str] = set()  # hosts that report no load, said once
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="admission", daemon=True)
        self._lock = threading.Lock()
        for url, host in self.hosts.items():
            pool.set_cap(url, streams(host.target))

    def start_thread(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def snapshot(self) -> dict[str, HostAdmission]:
        with self._lock:
            return {url: HostAdmission(target=h.target, mode=h.mode, load=h.load) for url, h in self.hosts.items()}

    def step(self) -> None:
        """One reading of every host, and the new targets."""
        healthy = set(self.pool.healthy())
        in_flight = self.pool.in_flight()
        others = self._others_streams()
        for url, host in self.hosts.items():
            if url not in healthy:
                with self._lock:
                    host.load = None  # a reading from before it went down says nothing now
                    if host.mode == "auto":
                        host.target, host.raised_from_tps = self.start, None
                self.pool.set_cap(url, streams(host.target))
                continue
            load = self._read(url, host)
            if load is None:
                with self._lock:
                    host.load = None
                continue
            with self._lock:
                host.load = load
                if host.mode == "fixed":
                    continue
                host.target = next_target(host, load, mine=in_flight.get(url, 0), ceiling=self.ceiling,
                                          now=time.monotonic(), others=others.get(url, 0))
            self.pool.set_cap(url, streams(host.target))

    def _others_streams(self) -> Mapping[str, int]:
        """The other workers' streams per host; none when their beacons cannot be read (a Redis
        blip): the pipe is then this worker's own, a lower bound, for a reading or two."""
        if not any(host.mode == "auto" for host in self.hosts.values()):
            return {}
        try:
            return self.others()
        except redis.RedisError as error:
            log.debug("the other workers' streams are not known: %s", error)
            return {}

    def _read(self, url: str, host: HostAdmission) -> ServerLoad | None:
        reading = self.server.read_load(url)
        if reading.problem is LoadProblem.UNANSWERED:
            return None  # the breaker and the probes judge the host; keep the last target
        if reading.problem is LoadProblem.ABSENT:
            if host.mode == "auto":
                self._fix(url, host, reading.detail)
            elif url not in self._unreadable:
                log.info("%s: %s: its load is not shown", url, reading.detail)
            self._unreadable.add(url)
            return None
        if reading.problem is LoadProblem.UNREADABLE:
            # An answer, but not a load (an error page, another schema): counted, unlike a host
            # that did not answer at all (the breaker and the probes judge that).
            log.debug("%s: %s", url, reading.detail)
            host.unreadable += 1
            if host.mode == "auto" and host.unreadable >= UNREADABLE_READINGS:
                self._fix(url, host, f"its {self.server.load_source} gave no load {UNREADABLE_READINGS} times in a row")
            return None
        host.unreadable = 0
        return reading.load

    def _fix(self, url: str, host: HostAdmission, why: str) -> None:
        """A host `auto` cannot steer by: its fixed share from now on, said once."""
        log.warning("%s: %s: its in-flight count stays fixed at %d", url, why, self.ceiling)
        with self._lock:
            host.mode, host.target = "fixed", self.ceiling
        self.pool.set_cap(url, self.ceiling)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.step()
            except Exception:  # noqa: BLE001 - the controller must outlive any one bad reading
                log.exception("admission control step failed")
