"""Delivery: message leases and the reaper that re-queues a dead worker's messages, and the check for
prompts nobody holds.

The workers' check for prompts nobody holds: enqueued, yet neither queued, in transit, running (in
kombu's `unacked`), done, skipped nor dead-lettered. Run by the lease reaper under its fleet-wide
lock, at most once per `unaccounted_check_interval_s` across the fleet.

Transit lists (`workers/broker.py`) close the window kombu's BRPOP left open, so such a prompt
means a loss no worker can repair (its message is gone: a Redis without AOF restarted, a key
deleted by hand, a message dropped by an older genfleet). What the check can do is say so: a row
found unaccounted for in two checks in a row (a message moves between queue, transit list and
`unacked` while a check reads them) is recorded in the run's state, `genfleet status` shows it
with the fix, `genfleet enqueue --recover-lost`.

Cost: each check reads every run's counters and the lengths of the queues, transit lists and
`unacked` (a few commands, under a millisecond). Only when those disagree (fewer messages than
prompts pending, other than the rows already recorded), or while rows wait for their second
sighting, does it read every message (O(queued + in flight), bounded with `--max-queue-depth`:
about 0.5 s per 10,000 queued prompts) and the bitmaps of the runs with prompts pending.

Fast, safe reclaim of a dead worker's tasks.

kombu's Redis transport restores an unacknowledged message only after the visibility timeout
(which must exceed the longest task, so hours), and restores a message whose task still runs if it
outlives that timeout. Instead, every message a worker holds gets a lease in Redis that the worker
renews on a heartbeat; the visibility timeout is set far above any task, and a reaper re-queues a
message only when its lease has expired, i.e. its worker is gone. A live task is never restored.
Expiries are written and judged on Redis's clock (common/redis_clock.py), never a host's own: a
worker whose clock is 90 s off neither loses its tasks to a punctual reaper nor shields them for
90 s after it dies.

This module owns the lease zset and the reaper lock (`common/keys.py`); a message's first lease is
written by `workers/broker.py` (`TAKE_DELIVERY`), in the same step that records its delivery, so
that no delivery is ever visible without one. Restoring
also writes kombu's own keys (`unacked`, `unacked_index`, the queue list); see `Reaper._restore`
for why that is not delegated to kombu. So does finishing an ack that Celery lost with its broker
connection (`LeaseKeeper._finish_ack`).
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.commands.core import Script

from genfleet.common import kombu_wire
from genfleet.common.keys import (
    KOMBU_UNACKED,
    KOMBU_UNACKED_INDEX,
    LEASES,
    PREFIX,
    REAPER_LOCK,
    TRANSITS,
    UNACCOUNTED_CHECK,
    RunKeys,
    queue_list,
)
from genfleet.common.queues import PARTITIONS
from genfleet.common.redis_clock import clock_for
from genfleet.common.run_state import RunState
from genfleet.workers import broker

log = logging.getLogger(__name__)

SCAN_CHUNK = 1000
Rows = dict[str, dict[str, set[int]]]  # run -> dataset -> rows


def check_if_due(client: redis.Redis, interval_s: float) -> dict[str, dict[str, int]] | None:
    """Runs `check` unless a worker did in the last `interval_s`; None if it did not run."""
    if not client.set(UNACCOUNTED_CHECK, "1", nx=True, ex=max(int(interval_s), 1)):
        return None
    return check(client)


def check(client: redis.Redis) -> dict[str, dict[str, int]]:
    """Records, per run and dataset, how many rows two checks in a row found unaccounted for;
    returns the runs that have any."""
    states = {run: RunState(client, run) for run in _runs(client)}
    pending = {run: total for run, state in states.items() if (total := _pending(state))}
    recorded = [run for run in states if client.exists(RunKeys(run).unaccounted)]
    for run in set(recorded) - set(pending):  # finished since: nothing can be missing
        states[run].record_unaccounted({})
    deficit = sum(pending.values()) - _messages(client)
    known = {run: states[run].unaccounted() for run in recorded if run in pending}
    if deficit <= 0 and not known:  # a message for every prompt pending, nothing recorded
        return {}
    if deficit > 0 and deficit == sum(sum(counts.values()) for counts in known.values()):
        return {run: counts for run, counts in known.items() if counts}  # the losses already recorded
    found = _unaccounted_rows(client, list(pending))
    report = {}
    for run in pending:
        confirmed = states[run].record_unaccounted(found.get(run, {}))
        if confirmed:
            report[run] = {dataset: len(rows) for dataset, rows in confirmed.items()}
            log.warning("run %s: %s prompt(s) neither queued, running, done nor dead: their messages are "
                        "lost; `genfleet enqueue --run %s --recover-lost DATASETS` publishes them again",
                        run, sum(report[run].values()), run)
    return report


def _runs(client: redis.Redis) -> list[str]:
    suffix = ":datasets"
    runs = []
    for raw in client.scan_iter(match=f"{PREFIX}:*{suffix}", count=SCAN_CHUNK):
        key = raw.decode() if isinstance(raw, bytes) else raw
        runs.append(key[len(PREFIX) + 1:-len(suffix)])
    return runs


def _pending(state: RunState) -> int:
    total = 0
    for dataset in state.datasets():
        c = state.counters(dataset)
        total += max(c["total"] - c["done"] - c["failed"] - c["skipped"], 0)
    return total


def _messages(client: redis.Redis) -> int:
    """Messages in queues, transit lists and `unacked`: one each per prompt pending, when none is lost."""
    transits = client.zrange(TRANSITS, 0, -1)
    pipe = client.pipeline(transaction=False)
    for key in [queue_list(queue) for queue in PARTITIONS] + list(transits):
        pipe.llen(key)
    pipe.hlen(KOMBU_UNACKED)
    return sum(pipe.execute())


def _unaccounted_rows(client: redis.Redis, runs: list[str]) -> Rows:
    """Rows enqueued (before the messages are read), then not present in any message, then not done
    nor dead (read after)."""
    states = {run: RunState(client, run) for run in runs}
    enqueued = {run: {ds: state.enqueued_row_set(ds) for ds in state.datasets()} for run, state in states.items()}
    present: Rows = defaultdict(lambda: defaultdict(set))
    for envelope in kombu_wire.held_messages(client, SCAN_CHUNK):
        payload = kombu_wire.task_payload(envelope)
        if payload and payload.get("run") in states:
            present[payload["run"]][payload["dataset"]].add(payload["row"])
    found: Rows = {}
    for run, state in states.items():
        dead: dict[str, set[int]] = defaultdict(set)
        for letter in state.read_dead_letters():
            dead[letter.payload.dataset].add(letter.payload.row)
        for dataset, rows in enqueued[run].items():
            missing = rows - present[run][dataset] - state.done_row_set(dataset) - dead[dataset]
            if missing:
                found.setdefault(run, {})[dataset] = missing
    return found




class Blackout:
    """When this process last could not trust its view of the leases: a Redis call failed or hung
    (a restart, a silent partition), or the process itself stood still past a heartbeat (a GC or VM
    pause, SIGSTOP). Nobody's heartbeat could be trusted to have renewed through that, so this
    process's reaper judges no lease for a lease's time after it (`Reaper._leases_trusted`)."""

    def __init__(self) -> None:
        self._at = float("-inf")

    def mark(self) -> None:
        self._at = time.monotonic()

    def within(self, seconds: float) -> bool:
        return time.monotonic() - self._at < seconds


@dataclass(eq=False)
class Delivery:
    """One delivery of a message to this worker process: what one lease covers, from Celery's
    receipt of the message to its task's end.

    A message this process holds can be delivered to it again: its lease lapsed while it ran (the
    process was paused past it), the reaper re-queued it, and this process took it back. Both
    deliveries share the delivery tag (kombu stamps it when the message is published) and the task
    id; they differ in kombu's delivery time, the message's `unacked_index` score, which
    `workers/broker.py`'s `QoS.append` writes on every delivery. Acks, give-backs and leases name a
    delivery by (tag, delivery time), never by task id."""
    tag: str
    task_id: str | None = None
    request: Any = None  # Celery's Request, to ask whether it will still run
    # Its `unacked_index` score, from the message (`broker.QoS.append`), or `broker.STALE_DELIVERY`.
    delivered_at: float | None = None
    # Set once the message is known to be delivered again (to this worker or another): this copy's
    # stream stops, and its ack or give-back touches nothing (`broker.settle`).
    superseded: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)


# A delivery's lease renewed on Redis's clock, only while `unacked_index` still holds that delivery:
# KEYS `unacked_index`, the lease zset; ARGV the tag, the delivery's score, the TTL. Returns 1, or 0
# (renewing nothing) where the message is gone or delivered again.
HOLD_LEASE = Script(None, b"""
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) then return 0 end
local now = redis.call('TIME')
local expiry = tonumber(now[1]) + tonumber(now[2]) / 1000000 + tonumber(ARGV[3])
redis.call('ZADD', KEYS[2], string.format('%.6f', expiry), ARGV[1])
return 1
""")


class LeaseKeeper:
    """Holds a lease for every delivery this worker process has received and will still run.

    **A lease follows what will actually run**, asked per delivery (`will_run`: Celery handed the
    request to its thread pool, or holds it in its timer for a countdown), not Celery's request
    sets: on a lost broker connection Celery empties its reserved set (celery 5.7.0
    `worker/consumer/consumer.py` `Consumer.on_close`), yet with the threads pool those requests
    already wait in the executor and will run. A request Celery dropped before handing it to the
    pool (a countdown retry in the timer, which `on_close` cancels) is not renewed: its message
    lapses to the reaper.

    **A message is never run twice at once by this process.** A second delivery of a message this
    process still holds supersedes the first copy, which stops streaming and frees its server slot;
    the new copy starts only once every older copy of its tag or task id has ended (`await_turn`),
    and then finds the row done if the old copy wrote it. A delivery whose message the heartbeat
    finds delivered again elsewhere (another `unacked_index` score) is superseded too: a worker
    that wakes from a pause past its lease stops the copies another worker is generating."""

    def __init__(self, client: redis.Redis, *, ttl_s: float, heartbeat_s: float,
                 will_run: Callable[[Any], bool] = lambda _request: True,
                 blackout: Blackout | None = None) -> None:
        self.redis, self.ttl_s, self.heartbeat_s = client, ttl_s, heartbeat_s
        self.clock = clock_for(client)  # expiries on Redis's clock, as the reaper judges them
        self.will_run = will_run
        self.blackout = blackout or Blackout()
        self._held: list[Delivery] = []  # in the order received
        # Finished deliveries whose lease is dropped once kombu no longer holds the message (acked, or
        # given back): the lease zset holds only messages in hand. Each maps to when it finished
        # (monotonic) and whether Celery acks its message (see `release`).
        self._released: dict[Delivery, tuple[float, bool]] = {}
        self._current = threading.local()  # the delivery each task thread runs (`bind`)
        # Superseded deliveries dropped before their task started, by id(request), for `bind`.
        self._superseded_unstarted: dict[int, tuple[Delivery, float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="lease-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def hold(self, tag: str, *, task_id: str | None = None, request: Any = None) -> Delivery:
        """Leases a message just received; a copy of it this process still holds is superseded.

        kombu recorded the delivery, and its first lease, before Celery saw the message (kombu 5.7.0
        `transport/virtual/base.py:645-649`: `QoS.append`, then the callback; workers/broker.py
        `TAKE_DELIVERY`), and the message carries its score. The lease is renewed only while
        `unacked` still holds that delivery: a worker starved between the two past its lease finds
        the message delivered again, to another worker, and this copy never runs."""
        # Its score before it is held: a heartbeat must never take another delivery's for its own.
        delivered_at = getattr(getattr(request, "message", None), "delivered_at", None)
        delivery = Delivery(tag, task_id, request, delivered_at=delivered_at)
        with self._lock:
            older = [each for each in self._held if each.tag == tag]
            self._held.append(delivery)
        if delivered_at == broker.STALE_DELIVERY:
            self._supersede(delivery, "was put back on its queue before this worker recorded it")
        elif delivered_at is not None:
            try:
                held = HOLD_LEASE(keys=[KOMBU_UNACKED_INDEX, LEASES], args=[tag, repr(delivered_at), self.ttl_s],
                                  client=self.redis)
            except redis.RedisError as error:  # its first lease stands; the heartbeat renews it
                self.blackout.mark()
                log.warning("lease of message %s not renewed at its receipt: %s", tag, error)
            else:
                if not held:
                    self._supersede(delivery, "its lease lapsed before this worker started it and it was delivered "
                                              "again")
        else:  # delivered by kombu's own path (BRPOP): no score on the message
            pipe = self.redis.pipeline(transaction=False)
            pipe.zadd(LEASES, {tag: self.clock.now() + self.ttl_s})
            pipe.zscore(KOMBU_UNACKED_INDEX, tag)
            _, delivery.delivered_at = pipe.execute()
        for copy in older:
            self._supersede(copy, "delivered to this worker again while a copy of it still runs here")
        return delivery

    def bind(self, request: Any) -> None:
        """The calling thread runs `request` (Celery calls `on_accepted` in the pool thread, just
        before the task: celery 5.7.0 `concurrency/base.py` `apply_target`)."""
        with self._lock:
            delivery = next((each for each in self._held if each.request is request), None)
            if delivery is None:  # superseded before Celery handed it to the pool (`renew`)
                delivery = self._superseded_unstarted.pop(id(request), (None, 0.0))[0]
            self._current.delivery = delivery

    def current(self) -> Delivery | None:
        """The delivery the calling task thread runs, if any."""
        return getattr(self._current, "delivery", None)

    def await_turn(self, delivery: Delivery, timeout_s: float) -> bool:
        """Waits until every older copy of `delivery`'s message in this process (same tag, or the same
        task id: a retry received before its attempt ended) has ended; False if one still runs."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                position = self._held.index(delivery) if delivery in self._held else 0
                older = [each for each in self._held[:position]
                         if each.tag == delivery.tag or (delivery.task_id and each.task_id == delivery.task_id)]
            if not older:
                return True
            log.warning("message %s (task %s): an older copy still runs in this worker; waiting for it to end",
                        delivery.tag, delivery.task_id)
            if not older[0].ended.wait(max(deadline - time.monotonic(), 0)):
                return False

    def release(self, delivery: Delivery | None, *, acked: bool) -> None:
        """Stop renewing the lease of a delivery whose task finished. The lease is not deleted yet:
        the message is acked just after the task returns, and until then it must not look abandoned
        to the reaper. The next heartbeat drops it once kombu's `unacked` no longer has the message.

        `acked`: Celery acks this message now (the task succeeded, failed, or published its retry:
        celery 5.7.0 celery/worker/request.py `on_success`, `on_retry`, `on_failure` with
        `acks_late`), rather than giving it back (`Reject(requeue=True)`). An ack sent while Redis
        is down is lost (`workers/broker.py`); left to the reaper, the message would run a second
        time beside the retry or follow-up it already published, and write its record twice. So
        the heartbeat finishes an ack that has not landed a beat after the task finished."""
        if delivery is None:
            return
        with self._lock:
            if delivery in self._held:
                self._released[delivery] = (time.monotonic(), acked and not delivery.superseded.is_set())
        self._forget(delivery)
        if self.current() is delivery:
            self._current.delivery = None

    def renew(self) -> None:
        started = time.monotonic()
        self._drop_released()
        with self._lock:  # a request Celery never handed on within a lease: it dropped it
            for key, (_, since) in list(self._superseded_unstarted.items()):
                if started - since > self.ttl_s:
                    del self._superseded_unstarted[key]
        with self._lock:
            held = list(self._held)
        if not held:
            return
        pipe = self.redis.pipeline(transaction=False)
        for delivery in held:
            pipe.zscore(KOMBU_UNACKED_INDEX, delivery.tag)
        renewed = []
        for delivery, delivered_at in zip(held, pipe.execute(), strict=True):
            if delivery.delivered_at is None:  # its first read failed (Redis was away at its receipt)
                delivery.delivered_at = delivered_at
            if delivered_at is not None and delivered_at != delivery.delivered_at:
                # Delivered again since (its lease lapsed: this process stood still past it).
                self._supersede(delivery, "its lease lapsed and it was delivered again")
            runs = self.will_run(delivery.request)
            if not runs and delivered_at != delivery.delivered_at:
                self._forget(delivery)  # dropped by Celery, and its message is not ours any more
                if delivery.superseded.is_set() and delivery.request is not None:
                    # Or not handed to the pool yet (Celery leases it on receipt, then hands it on:
                    # celery 5.7.0 `worker/strategy.py`, the task_received signal before `handle`).
                    # Should it start, its task finds this copy superseded (`bind`), never unguarded.
                    with self._lock:
                        self._superseded_unstarted[id(delivery.request)] = (delivery, time.monotonic())
            # A message kombu no longer holds (acked, re-queued, or lost with Redis's data) has no lease
            # to renew: a renewed lease would shield its next delivery from the reaper.
            elif runs and delivered_at is not None and not delivery.superseded.is_set():
                renewed.append(delivery.tag)
        if renewed:
            self.redis.zadd(LEASES, dict.fromkeys(renewed, self.clock.now() + self.ttl_s))
        if time.monotonic() - started > blocked_after(self.ttl_s):
            self.blackout.mark()  # renewed late: other workers' leases may have lapsed meanwhile too

    def _supersede(self, delivery: Delivery, why: str) -> None:
        if not delivery.superseded.is_set():
            delivery.superseded.set()
            log.warning("message %s (task %s) %s: this copy stops", delivery.tag, delivery.task_id, why)

    def _forget(self, delivery: Delivery) -> None:
        """No longer held here: not renewed, and any copy waiting for it (`await_turn`) may start."""
        with self._lock:
            if delivery in self._held:
                self._held.remove(delivery)
        delivery.ended.set()

    def _drop_released(self) -> None:
        with self._lock:
            released = dict(self._released)
        if not released:
            return
        tags = list({delivery.tag for delivery in released})
        settled = set(not_held(self.redis, tags))
        if settled:
            self.redis.zrem(LEASES, *settled)
        overdue = time.monotonic() - self.heartbeat_s
        done = {delivery for delivery in released if delivery.tag in settled}
        for delivery, (finished_at, acked) in released.items():
            if delivery in done or not acked or finished_at > overdue:
                continue
            if _ack_landed(delivery):
                # Redis took the ack, yet holds the message again: it lost that write (restarted from
                # an AOF cut back by its last second, a failover), and the prompt's done mark with it.
                # Left to the reaper: the message's lease lapses and the prompt runs again.
                log.warning("message %s is held again after its ack landed (Redis lost its last writes): left "
                            "to the reaper", delivery.tag)
            elif self._finish_ack(delivery):
                log.warning("acknowledged message %s: Celery's ack was lost with its broker connection", delivery.tag)
            # else redelivered since: its lease is that delivery's now
            done.add(delivery)
        with self._lock:
            for delivery in done:
                self._released.pop(delivery, None)

    def _finish_ack(self, delivery: Delivery) -> bool:
        """kombu's ack of this delivery, then its lease dropped; False where the message is no longer
        this delivery (redelivered, or its delivery time unknown), touching nothing."""
        if delivery.delivered_at is None or not broker.settle(self.redis, delivery.tag, delivery.delivered_at):
            return False
        self.redis.zrem(LEASES, delivery.tag)
        return True

    def _beat(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self.heartbeat_s):
            now = time.monotonic()
            if now - last > blocked_after(self.ttl_s) + self.heartbeat_s:
                # Paused (or starved) past a heartbeat: leases may have lapsed, and messages been
                # re-queued; `renew` finds which and stops those copies.
                log.warning("this worker stood still for %.1f s (a pause?): checking its leases", now - last)
                self.blackout.mark()
            try:
                self.renew()
            except redis.RedisError as error:  # Redis restarting: the next beat retries
                self.blackout.mark()
                log.warning("lease heartbeat failed: %s", error)
            last = time.monotonic()


def _ack_landed(delivery: Delivery) -> bool:
    """Whether Celery's ack of this delivery reached Redis: kombu marks a message acknowledged only
    once its ack returned (kombu 5.7.0 `message.py` `Message.ack` sets `_state` after `basic_ack`;
    an ack that failed on a lost connection leaves it unacknowledged)."""
    message = getattr(delivery.request, "message", None)
    return bool(message is not None and getattr(message, "acknowledged", False))


def blocked_after(ttl_s: float) -> float:
    """How long a Redis round trip (or a stand-still between heartbeats) may take before the view of
    the leases it gave counts as stale: a quarter of a lease, within [0.5 s, 2 s] (a round trip takes
    milliseconds)."""
    return min(2.0, max(ttl_s / 4, 0.5))


class Reaper:
    """Re-queues unacknowledged messages whose lease expired (their worker died)."""

    def __init__(self, client: redis.Redis, *, ttl_s: float, interval_s: float, restart_grace_s: float = 0.0,
                 unaccounted_interval_s: float = 0.0, blackout: Blackout | None = None) -> None:
        self.redis, self.ttl_s, self.interval_s = client, ttl_s, interval_s
        self.clock = clock_for(client)  # every host's leases judged on one clock: Redis's
        # No lease is judged this soon after Redis comes back (the workers pass their lease TTL).
        self.restart_grace_s = restart_grace_s
        # How often, fleet-wide, a reaper checks for prompts nobody holds (0: never).
        self.unaccounted_interval_s = unaccounted_interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lease-reaper", daemon=True)
        self._token = uuid.uuid4().hex
        # When this process last could not trust its view of the leases (shared with its
        # LeaseKeeper): see `_leases_trusted`.
        self.blackout = blackout or Blackout()
        self.blocked_s = blocked_after(ttl_s)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def reap_once(self) -> list[str]:
        """Restores every expired message, and puts back what dead consumers left in transit;
        returns the delivery tags restored."""
        started = time.monotonic()
        broker.renew_transits(self.redis)  # this process's consumers are alive
        # The lock means "a pass ran this interval", not "a pass is running": it is kept until it
        # expires, so the fleet makes one pass per interval however many workers ask. Deleted at
        # the end, the next worker's timer would start another pass at once, back to back: with
        # 200 workers ~0.3 of a Redis core spent re-reading every held message (docs/scaling.md).
        if not self.redis.set(REAPER_LOCK, self._token, nx=True, px=max(int(self.interval_s * 1000), 100)):
            return []
        if time.monotonic() - started > self.blocked_s:  # a call hung, or the client retried through an outage
            self.blackout.mark()
        try:
            return self._pass(started)
        except BaseException:
            # A pass that failed (Redis went away mid-way) frees the lock, so another worker retries soon.
            with contextlib.suppress(redis.RedisError):
                if self.redis.get(REAPER_LOCK) == self._token.encode():
                    self.redis.delete(REAPER_LOCK)
            raise

    def _pass(self, started: float) -> list[str]:
        if not self._leases_trusted():
            return []
        now = self.clock.now()
        # Only messages fetched more than a lease ago: a fresh one may not have its lease yet.
        candidates = self.redis.zrangebyscore(KOMBU_UNACKED_INDEX, 0, now - self.ttl_s)
        expired = [tag for tag, expiry in self._lease_expiries(candidates) if expiry is None or expiry <= now]
        if time.monotonic() - started > self.blocked_s:
            # The reads hung (a silent partition): while they did, no heartbeat could renew either.
            self.blackout.mark()
            return []
        restored = []
        for tag in expired:
            outcome = self._restore(tag)
            if outcome is None:  # the read under WATCH hung: the view is stale, no more judging
                self.blackout.mark()
                break
            if outcome:
                restored.append(tag)
        self._forget_orphans(now)
        broker.return_stranded(self.redis, self.ttl_s)
        if self.unaccounted_interval_s:
            try:
                check_if_due(self.redis, self.unaccounted_interval_s)
            except Exception:  # noqa: BLE001 - a report must never stop the reaper
                log.exception("the check for unaccounted prompts failed")
        return restored

    def _lease_expiries(self, raw_tags: list) -> Iterator[tuple[str, float | None]]:
        """Each held message's lease expiry, a thousand per round trip (ZMSCORE, Redis 6.2): one
        ZSCORE per held message made the reaper the fleet's largest Redis cost (docs/scaling.md)."""
        tags = [raw.decode() if isinstance(raw, bytes) else raw for raw in raw_tags]
        for start in range(0, len(tags), 1000):
            chunk = tags[start:start + 1000]
            yield from zip(chunk, self.redis.zmscore(LEASES, chunk), strict=True)

    def _leases_trusted(self) -> bool:
        """Whether a lapsed lease means a dead worker. Not within `restart_grace_s` of Redis coming
        back (a restart, or an outage this reaper saw): no worker could renew while Redis was away,
        and restoring then would hand every running task to a second worker. Given a lease's time,
        every live worker's heartbeat has renewed its leases."""
        if not self.restart_grace_s:
            return True
        if self.blackout.within(self.restart_grace_s):
            return False
        return float(self.redis.info("server").get("uptime_in_seconds", 0)) >= self.restart_grace_s

    def _forget_orphans(self, now: float) -> None:
        """Leases lapsed a while ago whose message kombu no longer holds: a worker that died after
        its task was acked never dropped its lease. Without this the zset would grow per prompt."""
        lapsed = [t.decode() if isinstance(t, bytes) else t
                  for t in self.redis.zrangebyscore(LEASES, "-inf", now - self.ttl_s)]
        if not lapsed:
            return
        orphans = not_held(self.redis, lapsed)
        if orphans:
            self.redis.zrem(LEASES, *orphans)

    def _restore(self, tag: str) -> bool | None:
        """kombu's own restore (kombu 5.7.0, kombu/transport/redis.py: `QoS.restore_by_tag` with
        `Channel._do_restore_message`), plus dropping the lease, in one transaction: out of the
        unacked set and index, marked redelivered, RPUSHed back onto its queue (next in line: the
        workers take from the right, BLMOVE RIGHT in workers/broker.py, as kombu's BRPOP would).

        Done here rather than by calling `QoS.restore_by_tag`: that method belongs to a live kombu
        Channel, which connects to the broker URL on creation (the reaper holds a Redis client, not
        the broker settings), and it runs its own MULTI, so the lease could not go in the same
        transaction. The message format is read and written by `common/kombu_wire.py`. Our
        exchanges route by routing key == queue name, so the routing key names the list, as
        kombu's exchange lookup would.

        Returns None, restoring nothing, where the read under WATCH took so long (Redis unreachable
        for a while) that a lapsed lease says nothing of its worker."""
        restored: bool | None = False
        asked = time.monotonic()

        def transaction(pipe: redis.client.Pipeline) -> None:
            nonlocal restored
            # Read again under WATCH: the lease may have been renewed since the pass read it (a
            # worker back from a Redis outage renews all its leases at once).
            expiry = pipe.zscore(LEASES, tag)
            if time.monotonic() - asked > self.blocked_s:
                restored = None
                return
            if expiry is not None and expiry > self.clock.now():
                return
            raw = pipe.hget(KOMBU_UNACKED, tag)
            pipe.multi()
            pipe.zrem(KOMBU_UNACKED_INDEX, tag)
            pipe.hdel(KOMBU_UNACKED, tag)
            pipe.zrem(LEASES, tag)
            if raw:
                envelope, _exchange, routing_key = kombu_wire.decode_unacked(raw)
                pipe.rpush(queue_list(routing_key), kombu_wire.redelivered(envelope))
                restored = True

        self.redis.transaction(transaction, KOMBU_UNACKED, LEASES)
        if restored:
            log.warning("re-queued message %s: its worker's lease expired", tag)
        return restored

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.reap_once()
            except redis.RedisError as error:
                self.blackout.mark()
                log.warning("reaper pass failed: %s", error)


def not_held(client: redis.Redis, tags: list[str]) -> list[str]:
    """The delivery tags among `tags` whose message kombu no longer holds (acked or given back)."""
    pipe = client.pipeline(transaction=False)
    for tag in tags:
        pipe.hexists(KOMBU_UNACKED, tag)
    return [tag for tag, held in zip(tags, pipe.execute(), strict=True) if not held]
