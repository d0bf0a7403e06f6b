"""genfleet's kombu Redis transport (`workers/broker.py`) against a real Redis:
a message goes from its queue through the consumer's transit list into `unacked` and is never only in
a worker's memory; what a dead consumer left in transit goes back to its queue; a channel closed by a
lost connection restores nothing and does not crash, and its messages can still be acknowledged."""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from helpers.kombu_messages import encoder
from helpers.redis_server import RedisServer, observer
from kombu import Connection, Consumer, Exchange, Queue
from kombu.message import Message

from genfleet.common.keys import KOMBU_UNACKED, LEASES, REAPER_LOCK, TRANSITS
from genfleet.common.queues import QUEUES, SHORT
from genfleet.workers import broker
from genfleet.workers.delivery import Reaper

GENFLEET = dict(transport="genfleet.workers.broker:Transport", transport_options={"priority_steps": [0]})
STOCK = dict(transport_options={"priority_steps": [0]})  # kombu 5.7.0's own Redis transport


def queue_message(client, row: int = 1) -> str:
    """Queues one task message as the producer does; returns its delivery tag."""
    payload = {"run": "r", "dataset": "d", "row": row, "id": f"d/{row}"}
    _task_id, raw = encoder().encode(payload, SHORT, payload["id"])
    client.lpush(SHORT, raw)
    return _tag(raw)


def _tag(raw: bytes) -> str:
    return json.loads(raw)["properties"]["delivery_tag"]


@contextmanager
def consumer(url: str, prefetch: int | None = None, **transport) -> Iterator[tuple[Connection, list[Message]]]:
    """A consumer of the short queue, as a worker's (prefetch unlimited unless given: a worker's is
    its concurrency); yields what it received. Closed afterwards whatever state the test left it in."""
    received: list[Message] = []
    short = next(queue for queue in QUEUES if queue.name == SHORT)
    connection = Connection(url, **transport)
    tasks = Consumer(connection.default_channel, queues=[Queue(short.name, short.exchange, short.routing_key)],
                     callbacks=[lambda _body, message: received.append(message)], accept=["msgpack"])
    if prefetch is not None:
        tasks.qos(prefetch_count=prefetch)
    tasks.consume()
    # Celery's remote-control mailbox: a second channel, consuming a fanout queue deleted on close.
    mailbox = Exchange("test.pidbox", type="fanout")
    Consumer(connection.channel(), queues=[Queue("worker.test.pidbox", mailbox, auto_delete=True)],
             callbacks=[lambda *_: None], accept=["json"]).consume()
    try:
        yield connection, received
    finally:
        try:
            connection.close()
        except Exception:  # noqa: BLE001 - the test may have broken it on purpose
            pass


def drain(connection: Connection, seconds: float = 0.3) -> None:
    """Runs the consumer's event loop for `seconds` (it ends with a blocking pop pending)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            connection.drain_events(timeout=left)
        except TimeoutError:
            return


def first_delivering_pass(connection: Connection, received: list[Message], timeout_s: float = 10.0) -> None:
    """Passes of the event loop (each handles one readable socket: the BLMOVE's reply, or the
    mailbox's) until one has delivered something."""
    deadline = time.monotonic() + timeout_s
    while not received:
        assert time.monotonic() < deadline, "nothing delivered"
        try:
            connection.drain_events(timeout=0.5)
        except TimeoutError:
            pass


def transit_lists(client) -> list[bytes]:
    return client.zrange(TRANSITS, 0, -1)


def test_a_message_goes_from_its_queue_through_a_transit_list_into_unacked(redis_client, redis_url):
    tag = queue_message(redis_client)
    with consumer(redis_url, **GENFLEET) as (connection, received):
        drain(connection)
        assert [m.delivery_tag for m in received] == [tag]
        assert redis_client.hexists(KOMBU_UNACKED, tag) and redis_client.llen(SHORT) == 0
        [key] = transit_lists(redis_client)
        assert redis_client.llen(key) == 0, "recorded as unacked and out of transit in one MULTI"
        received[0].ack()
        assert not redis_client.hexists(KOMBU_UNACKED, tag)


def test_free_slots_fill_from_the_waiting_messages_in_one_pass(redis_client, redis_url):
    """A worker with room for three takes three of five waiting messages in one pass of its event
    loop (one BLMOVE, then the rest in one round trip), oldest first, each recorded as unacked and
    out of transit; the other two wait on the queue for room."""
    tags = [queue_message(redis_client, row) for row in range(5)]
    with consumer(redis_url, prefetch=3, **GENFLEET) as (connection, received):
        first_delivering_pass(connection, received)
        assert [m.delivery_tag for m in received] == tags[:3]
        assert all(redis_client.hexists(KOMBU_UNACKED, tag) for tag in tags[:3])
        assert [_tag(raw) for raw in redis_client.lrange(SHORT, 0, -1)] == tags[:2:-1]  # the head is the right end
        [key] = transit_lists(redis_client)
        assert redis_client.llen(key) == 0
        received[0].ack()
        drain(connection)
        assert [m.delivery_tag for m in received] == tags[:4], "a freed slot takes the next one"


def test_a_delivery_failing_mid_pass_gives_the_rest_back_in_order(redis_client, redis_url, monkeypatch):
    tags = [queue_message(redis_client, row) for row in range(4)]
    delivered: list[str] = []
    deliver = broker.Channel._deliver_from_transit

    def fails_on_the_second(channel, item):
        if len(delivered) == 1:
            raise RuntimeError("a callback's bug")
        delivered.append(_tag(item))
        return deliver(channel, item)

    monkeypatch.setattr(broker.Channel, "_deliver_from_transit", fails_on_the_second)
    with pytest.raises(RuntimeError), consumer(redis_url, prefetch=4, **GENFLEET) as (connection, received):
        first_delivering_pass(connection, received)
    assert delivered == tags[:1]
    assert [_tag(raw) for raw in redis_client.lrange(SHORT, 0, -1)] == [tags[3], tags[2]], \
        "the undelivered ones back at the head, in their order"
    [key] = transit_lists(redis_client)
    assert [_tag(raw) for raw in redis_client.lrange(key, 0, -1)] == [tags[1]], \
        "the one that failed stays in transit for the reaper, as a failed BLMOVE delivery does"


def test_a_consumer_killed_between_the_pop_and_unacked_loses_nothing(redis_client, redis_url, monkeypatch):
    tag = queue_message(redis_client)

    def killed(*_args):  # the process dies right after BLMOVE, before recording the message
        raise SystemExit("SIGKILL")

    monkeypatch.setattr(broker.QoS, "append", killed)
    with pytest.raises(SystemExit), consumer(redis_url, **GENFLEET) as (connection, _received):
        drain(connection)
    monkeypatch.undo()
    [key] = transit_lists(redis_client)
    assert redis_client.llen(SHORT) == 0 and not redis_client.hexists(KOMBU_UNACKED, tag)
    assert redis_client.llen(key) == 1, "the message waits in the dead consumer's transit list"

    reaper = Reaper(redis_client, ttl_s=5, interval_s=1)
    reaper.reap_once()
    assert redis_client.llen(key) == 1, "left alone while its consumer may be alive"
    redis_client.zadd(TRANSITS, {key: time.time() - 6})  # nobody renewed it for a lease
    redis_client.delete(REAPER_LOCK)  # the next interval's pass
    reaper.reap_once()
    assert _tag(redis_client.lindex(SHORT, -1)) == tag, "back at the head of its queue"
    assert not redis_client.exists(key) and not transit_lists(redis_client)


def test_kombus_own_transport_loses_a_message_in_the_same_window(redis_client, redis_url, monkeypatch):
    queue_message(redis_client)
    monkeypatch.setattr(broker.kombu_redis.QoS, "append", lambda *_: (_ for _ in ()).throw(SystemExit("SIGKILL")))
    with pytest.raises(SystemExit), consumer(redis_url, **STOCK) as (connection, _received):
        drain(connection)
    assert redis_client.llen(SHORT) == 0 and redis_client.hlen(KOMBU_UNACKED) == 0  # gone


def test_an_open_channel_renews_its_transit_list_and_a_closed_one_stops(redis_client, redis_url):
    with consumer(redis_url, **GENFLEET) as (connection, _received):
        drain(connection, 0.1)
        [key] = transit_lists(redis_client)
        redis_client.zadd(TRANSITS, {key: 0})
        broker.renew_transits(redis_client)
        assert redis_client.zscore(TRANSITS, key) > time.time() - 5
    redis_client.zadd(TRANSITS, {key: 0})
    broker.renew_transits(redis_client)
    assert redis_client.zscore(TRANSITS, key) == 0


@pytest.fixture
def own_redis(tmp_path):
    """A redis-server this test may stop and start again, AOF on (its data survives)."""
    server = RedisServer(tmp_path / "redis", "--appendonly", "yes")
    server.start()
    yield server
    server.kill()


def lose_connection(connection: Connection, server: RedisServer) -> None:
    """What Celery's consumer does on a connection loss (celery/worker/consumer/consumer.py:466-487),
    with a BRPOP (or BLMOVE) outstanding when Redis went away."""
    drain(connection, 0.1)  # sends the blocking pop, which is still pending
    server.stop()
    connection.collect(socket_timeout=5)
    connection.close()


def test_kombus_own_transport_crashes_on_a_lost_connection_with_a_message_held(own_redis):
    client = observer(own_redis.url)
    queue_message(client)
    with consumer(own_redis.url, **STOCK) as (connection, received):
        drain(connection)
        assert received
        with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'hostname'"):
            lose_connection(connection, own_redis)


def test_a_lost_connection_restores_nothing_and_a_late_ack_still_lands(own_redis):
    client = observer(own_redis.url)
    tag = queue_message(client)
    with consumer(own_redis.url, **GENFLEET) as (connection, received):
        drain(connection)
        lose_connection(connection, own_redis)  # no AttributeError
        own_redis.start()
        client = observer(own_redis.url)
        assert client.hexists(KOMBU_UNACKED, tag) and client.llen(SHORT) == 0, "held, not handed to another worker"
        received[0].ack()  # the task finished after the reconnect: its message names the closed channel
        assert not client.hexists(KOMBU_UNACKED, tag)


def test_an_ack_while_redis_is_down_fails_as_a_connection_error_and_the_message_stays_held(own_redis):
    client = observer(own_redis.url)
    tag = queue_message(client)
    with consumer(own_redis.url, **GENFLEET) as (connection, received):
        drain(connection)
        lose_connection(connection, own_redis)
        with pytest.raises(tuple(connection.connection_errors)):
            received[0].ack()
        own_redis.start()
        assert observer(own_redis.url).hexists(KOMBU_UNACKED, tag)  # the lease path settles it


def test_the_reaper_judges_no_lease_within_a_lease_of_a_redis_restart(redis_client, monkeypatch):
    redis_client.hset(KOMBU_UNACKED, "t", '[{"properties": {}}, "short", "short"]')
    redis_client.zadd("unacked_index", {"t": time.time() - 600})
    redis_client.zadd(LEASES, {"t": time.time() - 1})  # lapsed while Redis was away
    reaper = Reaper(redis_client, ttl_s=5, interval_s=1, restart_grace_s=5)
    monkeypatch.setattr(redis_client, "info", lambda *_a, **_k: {"uptime_in_seconds": 2})
    assert reaper.reap_once() == [] and redis_client.hexists(KOMBU_UNACKED, "t")
    monkeypatch.setattr(redis_client, "info", lambda *_a, **_k: {"uptime_in_seconds": 6})
    redis_client.delete(REAPER_LOCK)  # the next interval's pass
    assert reaper.reap_once() == ["t"]


def test_closing_a_channel_does_not_wait_out_its_pending_blmove(redis_client, redis_url):
    """An idle worker's stop: kombu's close would read the pending BLMOVE to its end (here 30 s);
    genfleet's drops its connection, and a message queued afterwards is still there for the next."""
    with consumer(redis_url, **{**GENFLEET, "transport_options": {"priority_steps": [0], "polling_interval": 30}}) \
            as (connection, _received):
        drain(connection)  # ends with the BLMOVE an idle worker's event loop leaves pending
        assert connection.default_channel._pending == "BLMOVE"
        started = time.monotonic()
        connection.close()
        assert time.monotonic() - started < 10
    tag = queue_message(redis_client)
    assert redis_client.llen(SHORT) == 1 and tag  # nothing took it: the dropped BLMOVE ended in Redis
