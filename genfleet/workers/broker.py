"""kombu's Redis transport as genfleet uses it (wired in by `Celery(amqp=...)` in workers/lifecycle.py),
changed where kombu 5.7.0 loses or re-runs prompts. Tested against kombu 5.7.0 and celery 5.7.0
(pinned in pyproject.toml); the line numbers below are theirs. Needs Redis 6.2 or later (BLMOVE).

**A lost broker connection leaves the worker's messages where they are.** On a connection loss
Celery collects the connection, then closes it (celery/worker/consumer/consumer.py:476, :487).
Closing a virtual channel restores every message it holds to its queue (kombu/transport/virtual/
base.py:806 → `QoS.restore_unacked_once` :277-300 → kombu/transport/redis.py:493): tasks still
streaming would be handed to a second worker. And it crashed the worker. `collect`
(kombu/connection.py:432) closes the task channel first, and that close is cut short when it reads
its pending BRPOP reply from the dead socket (redis.py:1891-1895, before the channel is marked
closed); closing the other channels (virtual/base.py:988-997) stops at the first that fails (Celery's
remote-control mailbox deletes its fanout queue: redis.py:1901-1906); then `collect` clears the
transport's client (connection.py:429). The second close (consumer.py:487) reaches the restore,
which builds a Redis client from that `None` (redis.py:2089 → 2094 → 2065 → `_connparams`
1957-1959): AttributeError, which `ignore_errors` (kombu/common.py:330-335) does not swallow, so the
worker exits ("Unrecoverable error"). A race: only with a BRPOP pending on the task channel when the
loss is noticed on another socket, and a message held (nothing to restore otherwise: virtual/
base.py:294). An ack or reject of a task that finishes after the reconnect failed the same way on
the event loop (kombu/message.py:126, queued by celery's `call_soon_ack`): its message still names
the closed channel.

So `QoS.restore_at_shutdown` is off (virtual/base.py:180, checked at :289): a message a worker holds
stays in kombu's `unacked` hash, covered by its lease (`workers/delivery.py`): renewed while the task
runs, re-queued by the reaper once its worker is gone. And a channel remembers its broker address:
an ack on a closed channel goes over a fresh connection (the `unacked` hash is keyed by the delivery
tag alone, whichever channel received it). Where Redis is still down the ack fails with a connection
error, which Celery logs (`Message.ack_log_error`); the message stays unacked, and the lease
heartbeat finishes the ack once Redis answers (`LeaseKeeper.release`): re-queued, a message whose
task published a retry or a follow-up would run twice and write its record twice. A requeue on a
closed channel is left to the reaper, once its lease lapses: kombu's restore would look the queue up
through the closed channel and, failing, drop the message (redis.py:1265-1284 swallows that error
inside its transaction). Three more pieces make the restart free of duplicates: the reaper judges no
lease within a lease of Redis coming back, or of any of its calls hanging (none could be renewed
meanwhile: `Reaper._leases_trusted`); a lease follows what will actually run, so a request Celery
forgot on the reconnect but had already handed to its thread pool stays leased, while a countdown
retry it cancelled lapses to the reaper (consumer.py `on_close`; `LeaseKeeper`); and an ack or
give-back settles its own delivery only (`settle`: the message remembers its `unacked_index` score),
never a later delivery of the same message to this worker or another.

**A message taken off a queue is never only in a worker's memory** (the transit lists, below): where the
channel consumes one queue at one priority (genfleet's case: one pool per worker, `priority_steps`
`[0]`), it takes the next message with `BLMOVE queue transit RIGHT LEFT` instead of `BRPOP queue`
(redis.py:1459-1474, 1476-1502, same end of the queue), and `QoS.append` moves it from the transit
list into `unacked` in the same MULTI that records it there (redis.py:476-491).
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from queue import Empty
from typing import Any

import redis
from celery.app import amqp
from kombu import Connection
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps, loads
from redis.commands.core import Script

from genfleet.common import kombu_wire
from genfleet.common.keys import (
    KOMBU_UNACKED,
    KOMBU_UNACKED_INDEX,
    LEASES,
    TRANSITS,
    celery_event_channel,
    queue_list,
    transit_list,
    transit_queue,
)
from genfleet.common.kombu_wire import EVENT_ROUTING_KEY, TaskMessageEncoder
from genfleet.common.redis_clock import clock_for

log = logging.getLogger(__name__)

# Messages one pass of the event loop takes beyond the BLMOVE's (`Channel._deliver_waiting`): enough
# to fill a pool's slots in a few passes, few enough that acks and events still interleave.
INTAKE_BATCH = 50


# The message whose ack or give-back the calling thread is sending (`Message.ack`, `Message.reject`):
# kombu hands the QoS a delivery tag alone, which two deliveries of one message share.
_settling = threading.local()


class Message(virtual.Message):
    """kombu's message, carrying when its delivery was recorded in `unacked` (`QoS.append`), so that
    its ack or give-back settles that delivery only (`settle`). A message delivered twice to one
    channel (its lease lapsed while this worker stood still) is two Messages of one tag."""

    delivered_at: float | None = None

    def ack(self, multiple: bool = False) -> None:
        with _settling_message(self):
            super().ack(multiple=multiple)

    def reject(self, requeue: bool = False) -> None:
        with _settling_message(self):
            super().reject(requeue=requeue)


@contextlib.contextmanager
def _settling_message(message: Message) -> Iterator[None]:
    _settling.message = message
    try:
        yield
    finally:
        _settling.message = None


def _delivered_at(delivery_tag: str) -> float | None:
    message = getattr(_settling, "message", None)
    return message.delivered_at if message is not None and message.delivery_tag == delivery_tag else None


# A delivery's `delivered_at` where the reaper took its message back off this worker's transit list
# while the worker stood still between its BLMOVE and recording it (`QoS.append`): no `unacked_index`
# score is negative, so it settles nothing (`settle`) and its lease keeper never runs it.
STALE_DELIVERY = -1.0

# Out of the transit list and into `unacked`, with its first lease, in one step on Redis's clock,
# and only if the message is still on the list. KEYS: the transit list, `unacked_index`, `unacked`,
# the lease zset; ARGV: the message as it sits on the list, its delivery tag, kombu's unacked record,
# the lease TTL. Returns the delivery's `unacked_index` score, or false where the list no longer
# holds the message.
#
# A script, because each step apart left a window that a worker starved (a host with no CPU for it,
# a GC pause) past a lease fell into, and in which a second worker rightly took the message:
# - after the BLMOVE, before recording: the list lapsed (`return_stranded`), its message went back
#   to the queue and another worker took it; recorded on waking, it was then run here as well;
# - after recording, before the lease keeper leased it: `unacked` held it with no lease, which the
#   reaper reads as a dead worker's; the lease keeper, waking, took the new delivery's score as its
#   own and ran it beside the other worker.
# BLMOVE itself blocks, so it cannot run in a script; what follows it can, and Redis's `TIME` stamps
# the delivery and its lease at the instant they become visible, not when this host last ran.
TAKE_DELIVERY = Script(None, b"""
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return false end
local now = redis.call('TIME')
local at = tonumber(now[1]) + tonumber(now[2]) / 1000000
local score = string.format('%.6f', at)
redis.call('ZADD', KEYS[2], score, ARGV[2])
redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
redis.call('ZADD', KEYS[4], string.format('%.6f', at + tonumber(ARGV[4])), ARGV[2])
return score
""")  # bytes: redis-py hashes them as they are, with no client's encoder


class QoS(kombu_redis.QoS):
    restore_at_shutdown = False

    def append(self, message: Any, delivery_tag: str) -> None:
        raw = self.channel.take_in_transit()
        if raw is None:
            super().append(message, delivery_tag)
            return
        delivery = message.delivery_info
        record = dumps([message._raw, delivery["exchange"], delivery["routing_key"]])
        with self.channel.conn_or_acquire() as client:
            score = TAKE_DELIVERY(keys=[self.channel.transit_key, self.unacked_index_key, self.unacked_key, LEASES],
                                  args=[raw, delivery_tag, record, self.channel.lease_ttl_s], client=client)
        if score is None:
            log.warning("message %s was put back on its queue while this worker stood still between taking it and "
                        "recording it (past a lease): another worker has it, this copy will not run", delivery_tag)
            message.delivered_at = STALE_DELIVERY
        else:
            message.delivered_at = float(score)
        virtual.QoS.append(self, message, delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        delivered_at = _delivered_at(delivery_tag)
        if delivered_at is None:  # delivered by kombu's own path (BRPOP): kombu's ack
            super().ack(delivery_tag)
            return
        with self.channel.conn_or_acquire() as client:
            settle(client, delivery_tag, delivered_at)
        virtual.QoS.ack(self, delivery_tag)  # this channel's own bookkeeping

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if requeue and self.channel.detached:
            log.warning("message %s stays unacknowledged: its broker connection was lost; the reaper re-queues "
                        "it once its lease lapses", delivery_tag)
            virtual.QoS.ack(self, delivery_tag)  # this channel's own bookkeeping only
            return
        delivered_at = _delivered_at(delivery_tag)
        if delivered_at is None:
            super().reject(delivery_tag, requeue=requeue)
            return
        with self.channel.conn_or_acquire() as client:
            settle(client, delivery_tag, delivered_at, requeue=requeue)
        virtual.QoS.ack(self, delivery_tag)


def settle(client: redis.Redis, tag: str, delivered_at: float, *, requeue: bool = False) -> bool:
    """kombu's ack of one delivery (kombu 5.7.0 kombu/transport/redis.py `QoS.ack` →
    `_remove_from_indices`), or its give-back (`QoS.reject(requeue=True)` → `restore_by_tag(leftmost=True)`:
    marked redelivered, LPUSHed behind the queue's waiting messages), in one transaction, only if
    `unacked` still holds this delivery: its `unacked_index` score is `delivered_at`. Returns False,
    touching nothing, where it does not: the message's lease lapsed and it was delivered again, to
    this worker or another. kombu's own ack removes the message whichever delivery holds it, and its
    restore would re-queue a message another worker is running: a third copy."""
    settled = False

    def transaction(pipe: redis.client.Pipeline) -> None:
        nonlocal settled
        if pipe.zscore(KOMBU_UNACKED_INDEX, tag) != delivered_at:
            return
        raw = pipe.hget(KOMBU_UNACKED, tag) if requeue else None
        pipe.multi()
        pipe.zrem(KOMBU_UNACKED_INDEX, tag)
        pipe.hdel(KOMBU_UNACKED, tag)
        if raw:
            envelope, _exchange, routing_key = kombu_wire.decode_unacked(raw)
            pipe.lpush(queue_list(routing_key), kombu_wire.redelivered(envelope))
        settled = True

    client.transaction(transaction, KOMBU_UNACKED_INDEX)
    return settled


class Channel(kombu_redis.Channel):
    QoS = QoS
    Message = Message
    # A delivery's first lease (`TAKE_DELIVERY`): the worker's `lease_ttl_s`, passed as a transport
    # option (workers/lifecycle.py) that kombu sets on the channel (kombu 5.7.0
    # `transport/virtual/base.py` `Channel.__init__` copies `from_transport_options`).
    from_transport_options = (*kombu_redis.Channel.from_transport_options, "lease_ttl_s")  # type: ignore[assignment]  # kombu types it by its own length
    lease_ttl_s: float = 60.0
    # The synchronous client's connection parameters, kept from while the channel was open.
    _open_connparams: dict | None = None
    transit_key: str | None = None
    _pending: str | None = None  # the blocking pop in flight: "BLMOVE", or kombu's "BRPOP"
    _in_transit: bytes | None = None  # the message being delivered, as it sits in the transit list

    _sync_client: redis.Redis | None = None

    def _create_client(self, asynchronous: bool = False) -> redis.Redis:
        """kombu 5.7.0 (`transport/redis.py`, `conn_or_acquire`) builds a new `redis.Redis` for
        each command it sends outside the event loop: every task event (`_put_fanout`), every ack
        (`QoS.pipe_or_acquire`). The object is only a front for the channel's connection pool,
        but building one fills a table of ~170 response callbacks: 6% of a worker's CPU. The
        synchronous one is made once per pool; a Redis client is safe to share between threads
        (each command takes its own connection from the pool)."""
        if asynchronous:
            return super()._create_client(asynchronous=True)
        pool = self.pool
        client = self._sync_client
        if client is None or client.connection_pool is not pool:
            client = self._sync_client = super()._create_client()
        return client

    def _transit_source(self) -> str | None:
        """The one list this channel consumes, where BLMOVE can replace BRPOP."""
        queues = list(self.active_queues)
        if len(queues) != 1 or list(self.priority_steps) != [0] or self.global_keyprefix:
            return None
        return queues[0]

    def _brpop_start(self, timeout: float | None = None) -> None:
        source = self._transit_source()
        if source is None:
            self._pending = "BRPOP"
            return super()._brpop_start(timeout)
        if self.transit_key is None:
            key = transit_list(source, uuid.uuid4().hex)
            with self.conn_or_acquire() as client:
                register_transit(client, key)
            self.transit_key = key
        self._queue_cycle.consume(1)
        self._pending = "BLMOVE"
        self._in_poll = self.client.connection
        self._brpop_sent_at = time.monotonic()  # type: ignore[assignment]  # kombu types it by its None default
        wait = self.brpop_timeout if timeout is None else timeout
        self.client.connection.send_command("BLMOVE", source, self.transit_key, "RIGHT", "LEFT", wait or 0)

    def _brpop_read(self, **options: Any) -> bool:
        if self._pending != "BLMOVE":
            return super()._brpop_read(**options)
        try:
            try:
                item = self.client.parse_response(self.client.connection, "BLMOVE", **options)
            except self.connection_errors:
                self.client.connection.disconnect()
                raise
            if not item:
                raise Empty()
            self._deliver_from_transit(item)
            self._deliver_waiting()
            return True
        finally:
            self._in_poll = None  # type: ignore[assignment]  # kombu types it by its False default, sets None too
            self._pending = None
            self._flush_brpop_reauth()

    def _deliver_from_transit(self, item: bytes) -> bool:
        assert self.transit_key is not None  # set by _brpop_start before the BLMOVE that delivered `item`
        source = transit_queue(self.transit_key)
        self._queue_cycle.rotate(source)
        self._in_transit = item
        try:
            self.connection._deliver(loads(bytes_to_str(item)), source)
        finally:
            left, self._in_transit = self._in_transit, None
        if left is not None:  # handled without QoS.append (kombu rejected it back to its queue)
            with self.conn_or_acquire() as client:
                client.lrem(self.transit_key, 1, left)
        return True

    def _deliver_waiting(self) -> None:
        """More of the queue's waiting messages, as many as QoS has room for (up to INTAKE_BATCH),
        moved to the transit list in one round trip and delivered in this same pass of the event
        loop: a worker's empty slots fill at once after a start, a restart or a burst, where one
        BLMOVE per message took a round trip and a pass of the loop each (150 slots: ~0.4 s of an
        idle core, seconds beside a busy server), and Celery sends their task events as one
        message (its `task.multi` group, flushed once per pass: celery 5.7.0
        `worker/consumer/events.py` `buffer_group`, `events/dispatcher.py` `flush`). The room is
        kombu's own estimate (kombu 5.7.0 `transport/virtual/base.py` `QoS.can_consume_max_estimate`:
        the prefetch count less what is delivered and unacked). In steady state a finished task
        frees one slot, which the BLMOVE fills, and this finds no room."""
        room = min(self.qos.can_consume_max_estimate() or 0, INTAKE_BATCH)
        if room < 1 or self.transit_key is None:
            return
        source = transit_queue(self.transit_key)
        with self.conn_or_acquire() as client:
            pipe = client.pipeline(transaction=False)
            # The list renewed as the messages reach it: a reaper judges it by its last renewal, and
            # these wait on it for the whole pass, not the instant a BLMOVE's message does.
            pipe.zadd(TRANSITS, {self.transit_key: clock_for(client).now()})
            for _ in range(room):
                pipe.lmove(source, self.transit_key, "RIGHT", "LEFT")
            items = [item for item in pipe.execute()[1:] if item]
        for index, item in enumerate(items):
            try:
                self._deliver_from_transit(item)
            except BaseException:
                self._give_back(source, items[index + 1:])
                raise

    def _give_back(self, source: str, items: list[bytes]) -> None:
        """Messages moved to the transit list but not delivered, back to the head of their queue in
        their order (where BLMOVE takes from), so that a live channel's transit list never keeps
        one that no task runs."""
        if not items:
            return
        with self.conn_or_acquire() as client:
            pipe = client.pipeline(transaction=True)
            for item in reversed(items):
                pipe.lrem(self.transit_key, 1, item).rpush(source, item)
            pipe.execute()

    def take_in_transit(self) -> bytes | None:
        """The message being delivered, for QoS.append to move out of the transit list."""
        raw, self._in_transit = self._in_transit, None
        return raw

    def close(self) -> None:
        if self.transit_key is not None:
            forget_transit(self.transit_key)
        if self._pending == "BLMOVE" and self._in_poll:
            # kombu's close reads a pending pop to its end (kombu 5.7.0 `transport/redis.py`
            # `Channel.close`): a warm shutdown of an idle worker would wait out the BLMOVE's
            # timeout. Its connection is dropped instead, which ends the BLMOVE in Redis; a message
            # it moved in that instant stays on this channel's transit list, which is no longer
            # renewed, and the reaper puts it back on its queue once it lapses.
            self._in_poll, self._pending = None, None  # type: ignore[assignment]  # kombu types it by its False default
            self.client.connection.disconnect()  # the connection the BLMOVE was sent on (`_brpop_start`)
        super().close()

    @property
    def detached(self) -> bool:
        """Closed by a lost connection while messages it delivered are still being worked on."""
        return self.connection is None or self.connection.client is None

    def _connparams(self, asynchronous: bool = False) -> dict:
        if self.detached:
            if asynchronous or self._open_connparams is None:
                raise redis.ConnectionError("this channel's broker connection was closed")
            return dict(self._open_connparams)
        params = super()._connparams(asynchronous=asynchronous)
        if not asynchronous:
            self._open_connparams = dict(params)
        return params


class Transport(kombu_redis.Transport):
    Channel = Channel


class BrokerConnection(Connection):
    """kombu's Connection, with the Transport above wherever kombu would take its Redis transport.
    Chosen by class rather than by name (`broker_transport`), so a URL still reads `redis://` or
    `rediss://` everywhere it is shown: logs, and Flower, which picks its broker client by scheme."""

    def get_transport_cls(self) -> type:
        transport = super().get_transport_cls()
        return Transport if transport is kombu_redis.Transport else transport


class AMQP(amqp.AMQP):
    """Celery's AMQP helper with that connection (`Celery(amqp=...)`, workers/lifecycle.py)."""
    Connection = BrokerConnection
    BrokerConnection = BrokerConnection

# -- transit lists: the registry and the return of a dead consumer's list --------------------------
# This module is the one writer of the transit lists and of their registry (`common/keys.py`,
# `TRANSITS`). Each worker process names its open channels' lists on its reaper's beat
# (`renew_transits`); a list whose worker stopped naming it for a lease TTL belongs to a dead
# consumer, and the reaper (`return_stranded`, under its fleet-wide lock) puts its messages back at
# the head of their queue, unless kombu already holds them as unacked (cannot happen with the
# transaction in `QoS.append`; kept as a guard).

_open: set[str] = set()  # this process's channels' transit lists
_lock = threading.Lock()


def register_transit(client: redis.Redis, key: str) -> None:
    """A channel's list, named before its first BLMOVE, so that the reaper can find it."""
    client.zadd(TRANSITS, {key: clock_for(client).now()})
    with _lock:
        _open.add(key)


def forget_transit(key: str) -> None:
    """The channel closed: its list is no longer renewed; whatever it holds goes back to its queue
    once it has lapsed."""
    with _lock:
        _open.discard(key)


def renew_transits(client: redis.Redis) -> None:
    """This process is alive: each of its open channels' lists is, too."""
    with _lock:
        keys = list(_open)
    if keys:
        client.zadd(TRANSITS, dict.fromkeys(keys, clock_for(client).now()))


def return_stranded(client: redis.Redis, ttl_s: float) -> int:
    """Puts back on their queue the messages of every transit list not renewed for `ttl_s`; drops
    those lists. Returns how many messages went back."""
    lapsed = client.zrangebyscore(TRANSITS, "-inf", clock_for(client).now() - ttl_s)
    returned = 0
    for raw_key in lapsed:
        key = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
        returned += _return_list(client, key)
    return returned


def _return_list(client: redis.Redis, key: str) -> int:
    returned = 0

    def transaction(pipe: redis.client.Pipeline) -> None:
        nonlocal returned
        items = pipe.lrange(key, 0, -1)  # newest first (BLMOVE pushes on the left)
        held = [pipe.hexists(KOMBU_UNACKED, _delivery_tag(item)) for item in items]
        pipe.multi()
        back = [item for item, is_held in zip(items, held, strict=True) if not is_held]
        if back:  # RPUSH: next in line (consumers pop from the right), oldest first
            pipe.rpush(queue_list(transit_queue(key)), *reversed(back))
        pipe.delete(key)
        pipe.zrem(TRANSITS, key)
        returned = len(back)

    client.transaction(transaction, key)
    if returned:
        log.warning("put %d message(s) back on queue %s: taken off it by a consumer that died before "
                    "recording them (%s)", returned, transit_queue(key), key)
    return returned


def _delivery_tag(raw: bytes) -> str:
    try:
        return str(kombu_wire.decode_queued(raw).get("properties", {}).get("delivery_tag", ""))
    except ValueError:  # not kombu's JSON: it goes back to its queue all the same
        return ""


class NextInLine:
    """Publishes a task at the consuming end of its queue: RPUSH, where consumers BLMOVE from (and
    where kombu's own restore puts a message back: redis.py `_do_restore_message`), instead of
    Celery's LPUSH behind everything waiting (kombu/transport/redis.py `Channel._put`). The message
    is the one kombu would store (common/kombu_wire.py), with the task-sent event Flower reads, in
    one MULTI. For the follow-up of a staged cap (workers/generation/first_cap.py): a part of a
    completion in progress, whose prefix the host's radix cache still holds."""

    def __init__(self, app: Any, client: redis.Redis) -> None:
        self.client = client
        self.encoder = TaskMessageEncoder(app)
        self.event_channel = celery_event_channel(int(client.connection_pool.connection_kwargs.get("db", 0)),
                                                  EVENT_ROUTING_KEY)
        self._lock = threading.Lock()  # the encoder's packer and id pool serve one thread at a time

    def publish(self, payload: dict[str, Any], queue: str, argsrepr: str) -> None:
        with self._lock:
            task_id, message = self.encoder.encode(payload, queue, argsrepr)
            event = self.encoder.encode_sent_event(task_id, queue, argsrepr)
        pipe = self.client.pipeline(transaction=True)
        pipe.rpush(queue_list(queue), message)
        pipe.publish(self.event_channel, event)
        pipe.execute()
