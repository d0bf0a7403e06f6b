"""Leases and the reaper against a real Redis, with a message held the way a worker holds it
(kombu's own `basic_get`): a lease is renewed only while kombu still holds its message, a live
one is never reaped however old its message, and an expired one is restored exactly once, by one
reaper at a time."""
from __future__ import annotations

import time

import pytest
import redis
from helpers.kombu_messages import held_message

from genfleet.common.keys import KOMBU_UNACKED, KOMBU_UNACKED_INDEX, LEASES, REAPER_LOCK
from genfleet.common.queues import SHORT
from genfleet.common.redis_clock import read
from genfleet.workers.delivery import LeaseKeeper, Reaper

PAYLOAD = {"run": "r", "dataset": "d", "row": 1, "id": "d/1"}


@pytest.fixture
def held(redis_client, redis_url):
    """The delivery tag of a message a (live) consumer holds unacknowledged."""
    with held_message(redis_client, redis_url, PAYLOAD) as message:
        assert redis_client.hexists(KOMBU_UNACKED, message.delivery_tag)
        yield message.delivery_tag


def redis_now(client) -> float:
    """Redis's clock, which leases are written and judged with (common/redis_clock.py)."""
    return read(client).redis_time


def lease_left(client, tag: str) -> float | None:
    expiry = client.zscore(LEASES, tag)
    return None if expiry is None else expiry - redis_now(client)


def fetched_long_ago(client, tag: str, seconds: float = 600) -> None:
    client.zadd(KOMBU_UNACKED_INDEX, {tag: redis_now(client) - seconds})


def test_a_held_lease_is_renewed_and_once_released_left_to_lapse_until_the_message_is_acked(redis_client, held):
    keeper = LeaseKeeper(redis_client, ttl_s=60, heartbeat_s=1)
    delivery = keeper.hold(held)
    assert 59 < lease_left(redis_client, held) <= 60.01  # two readings of Redis's clock, each within half a round trip
    redis_client.zadd(LEASES, {held: redis_now(redis_client) + 1})  # a minute goes by
    keeper.renew()
    assert 59 < lease_left(redis_client, held) <= 60.01  # two readings of Redis's clock, each within half a round trip

    keeper.release(delivery, acked=True)
    redis_client.zadd(LEASES, {held: redis_now(redis_client) + 1})
    keeper.renew()
    # Not renewed, and not deleted either: until the ack the message must not look abandoned.
    assert 0 < lease_left(redis_client, held) <= 1
    redis_client.hdel(KOMBU_UNACKED, held)  # acknowledged
    keeper.renew()
    assert lease_left(redis_client, held) is None


def test_an_ack_lost_with_the_broker_connection_is_finished_a_heartbeat_after_the_task(redis_client, held):
    """Celery acked (a success, a failure, or a retry it published) while Redis was down: the ack is
    lost and the message stays unacked. Left to the reaper it would run again beside its retry and
    write a second record (seen in `test_chaos_redis_restart`); the heartbeat finishes the ack."""
    keeper = LeaseKeeper(redis_client, ttl_s=60, heartbeat_s=0.05)
    delivery = keeper.hold(held)
    keeper.release(delivery, acked=True)
    keeper.renew()
    assert redis_client.hexists(KOMBU_UNACKED, held), "Celery's own ack gets a heartbeat first"
    time.sleep(0.06)
    keeper.renew()
    assert not redis_client.hexists(KOMBU_UNACKED, held) and redis_client.zscore(KOMBU_UNACKED_INDEX, held) is None
    assert lease_left(redis_client, held) is None
    fetched_long_ago(redis_client, held)
    assert Reaper(redis_client, ttl_s=60, interval_s=1).reap_once() == [] and redis_client.llen(SHORT) == 0


def test_an_ack_that_landed_and_was_lost_with_redis_last_second_is_left_to_the_reaper(redis_client, held):
    """Redis restarted from an AOF cut back by its last second forgets the ack and the done mark
    written in it: the message is held again, and must run again, not be acknowledged a second time
    (which would leave the prompt neither done nor queued: found in `make soak`, seed 1)."""
    keeper = LeaseKeeper(redis_client, ttl_s=60, heartbeat_s=0.05)
    request = CeleryRequest(held, in_pool=True)
    request.message.acknowledged = True  # Celery's ack returned
    delivery = keeper.hold(held, request=request)
    keeper.release(delivery, acked=True)
    time.sleep(0.06)
    keeper.renew()
    assert redis_client.hexists(KOMBU_UNACKED, held), "acknowledged again: the prompt would never run again"
    redis_client.zadd(LEASES, {held: redis_now(redis_client) - 1})
    fetched_long_ago(redis_client, held)
    assert Reaper(redis_client, ttl_s=60, interval_s=1).reap_once() == [held]


def test_a_message_given_back_while_redis_was_down_is_left_to_the_reaper(redis_client, held):
    keeper = LeaseKeeper(redis_client, ttl_s=60, heartbeat_s=0.05)
    delivery = keeper.hold(held)
    keeper.release(delivery, acked=False)  # Reject(requeue=True) on a lost connection
    time.sleep(0.06)
    keeper.renew()
    assert redis_client.hexists(KOMBU_UNACKED, held) and lease_left(redis_client, held) > 0


def test_a_lost_ack_is_not_finished_for_a_message_redelivered_to_another_worker(redis_client, held):
    keeper = LeaseKeeper(redis_client, ttl_s=60, heartbeat_s=0.05)
    delivery = keeper.hold(held)
    keeper.release(delivery, acked=True)
    # The reaper restored it and another worker took it: a new delivery time, that worker's lease.
    redis_client.zadd(KOMBU_UNACKED_INDEX, {held: redis_now(redis_client) + 1})
    redis_client.zadd(LEASES, {held: redis_now(redis_client) + 600})
    time.sleep(0.06)
    keeper.renew()
    assert redis_client.hexists(KOMBU_UNACKED, held) and lease_left(redis_client, held) > 500
    redis_client.zadd(LEASES, {held: redis_now(redis_client) + 1})
    keeper.renew()
    assert lease_left(redis_client, held) <= 1, "the other worker's lease is not this keeper's to renew"


def test_a_lease_whose_message_kombu_no_longer_holds_is_not_renewed(redis_client, held):
    keeper = LeaseKeeper(redis_client, ttl_s=60, heartbeat_s=1)
    keeper.hold(held)
    redis_client.hdel(KOMBU_UNACKED, held)  # restored elsewhere, or acked: out of kombu's hash and index
    redis_client.zrem(KOMBU_UNACKED_INDEX, held)
    redis_client.zadd(LEASES, {held: redis_now(redis_client) + 1})
    keeper.renew()
    assert lease_left(redis_client, held) <= 1, "a renewed lease would shield the message from the reaper"


def test_a_retry_received_before_its_attempt_finished_keeps_its_lease(redis_client):
    """Celery's retry keeps the task id, so a worker may receive the retry (its own delivery tag)
    before the attempt's `task_postrun`: releasing the attempt must not drop the retry's lease, or
    the reaper re-queues the retry while Celery holds it for its countdown (generated twice). The
    release names the attempt's own delivery, never "the running one of this task id"."""
    keeper = LeaseKeeper(redis_client, ttl_s=60, heartbeat_s=1)
    for tag in ("t-attempt", "t-retry"):
        redis_client.hset(KOMBU_UNACKED, tag, "[]")
        redis_client.zadd(KOMBU_UNACKED_INDEX, {tag: redis_now(redis_client)})
    attempt = keeper.hold("t-attempt", task_id="task-1")
    keeper.hold("t-retry", task_id="task-1")
    keeper.release(attempt, acked=True)  # the attempt's postrun
    redis_client.zadd(LEASES, {"t-attempt": redis_now(redis_client) + 1, "t-retry": redis_now(redis_client) + 1})
    keeper.renew()
    assert lease_left(redis_client, "t-retry") > 59
    assert lease_left(redis_client, "t-attempt") <= 1  # left to lapse until its ack


class CeleryRequest:
    """What genfleet reads of a celery `Request`: its task id and its message's delivery tag; where
    Celery handed it to the pool, `_apply_result` (celery 5.7.0 `worker/request.py`)."""

    def __init__(self, tag: str, *, in_pool: bool = False) -> None:
        self.id, self.name = "task-1", "genfleet.generate"
        self.message = type("Message", (), {"delivery_tag": tag})()
        self._apply_result = (lambda: None) if in_pool else None


def test_a_reconnect_keeps_the_leases_of_requests_queued_in_the_thread_pool_and_drops_a_countdowns(redis_client):
    """On a lost broker connection Celery's own `Consumer.on_close` (run here on Celery's real request
    sets) forgets the requests it reserved but had not started, and cancels its countdowns. With the
    threads pool the reserved ones already wait in the executor and will run: their leases must be
    renewed, or the reaper re-queues them and this worker runs them twice (the double run a Redis
    restart under a busy long pool caused). The countdown will never run: its lease lapses."""
    from types import SimpleNamespace

    from celery.worker import state
    from celery.worker.consumer.consumer import Consumer

    from genfleet.workers.runtime import celery_will_run

    queued, running = CeleryRequest("t-queued", in_pool=True), CeleryRequest("t-running", in_pool=True)
    countdown = CeleryRequest("t-countdown")
    countdown._eta_timer_entry = None
    for tag in ("t-queued", "t-running", "t-countdown"):
        redis_client.hset(KOMBU_UNACKED, tag, '[{"properties": {}}, "short", "short"]')
        redis_client.zadd(KOMBU_UNACKED_INDEX, {tag: redis_now(redis_client) - 600})
    keeper = LeaseKeeper(redis_client, ttl_s=60, heartbeat_s=1, will_run=celery_will_run)
    try:
        state.task_reserved(queued)
        state.task_reserved(running)
        state.task_accepted(running)
        state.task_scheduled(countdown)
        for request in (queued, running, countdown):
            keeper.hold(request.message.delivery_tag, task_id=request.id, request=request)
        Consumer.on_close(SimpleNamespace(controller=None, task_buckets={}, timer=None, pool=None))
        assert queued not in state.reserved_requests, "Celery forgot the queued request"
        redis_client.zadd(LEASES, dict.fromkeys(("t-queued", "t-running", "t-countdown"), redis_now(redis_client) + 1))
        keeper.renew()
    finally:
        state.reset_state()
    assert lease_left(redis_client, "t-queued") > 59 and lease_left(redis_client, "t-running") > 59
    assert lease_left(redis_client, "t-countdown") <= 1
    redis_client.zadd(LEASES, {"t-countdown": redis_now(redis_client) - 1})
    assert Reaper(redis_client, ttl_s=60, interval_s=1).reap_once() == ["t-countdown"]


def test_a_message_delivered_again_to_the_same_worker_stops_the_older_copy_and_waits_for_it(redis_client, held):
    """A worker paused past its lease finds its message re-queued and takes it back while the first
    copy still streams: the first copy is told to stop, the second starts only once it has ended,
    and neither the older copy's lease nor its end touches the new delivery."""
    keeper = LeaseKeeper(redis_client, ttl_s=60, heartbeat_s=1)
    first = keeper.hold(held, task_id="task-1")
    redis_client.zadd(KOMBU_UNACKED_INDEX, {held: redis_now(redis_client) + 0.5})  # restored, delivered again
    second = keeper.hold(held, task_id="task-1")
    assert first.superseded.is_set() and not second.superseded.is_set()
    assert not keeper.await_turn(second, timeout_s=0.05), "the older copy still runs"
    keeper.release(first, acked=False)
    assert keeper.await_turn(second, timeout_s=0.05)
    redis_client.zadd(LEASES, {held: redis_now(redis_client) + 1})
    keeper.renew()
    assert lease_left(redis_client, held) > 59, "the new delivery keeps its lease"


def test_a_copy_whose_message_another_worker_took_is_stopped_by_the_heartbeat(redis_client, held):
    keeper = LeaseKeeper(redis_client, ttl_s=60, heartbeat_s=1)
    delivery = keeper.hold(held)
    keeper.renew()
    assert not delivery.superseded.is_set()
    # The reaper re-queued it while this worker stood still, and another worker took it.
    redis_client.zadd(KOMBU_UNACKED_INDEX, {held: redis_now(redis_client) + 0.5})
    redis_client.zadd(LEASES, {held: redis_now(redis_client) + 5})
    keeper.renew()
    assert delivery.superseded.is_set()
    assert lease_left(redis_client, held) <= 5, "the other worker's lease is not this keeper's to renew"


def test_an_ack_or_give_back_settles_its_own_delivery_only(redis_client, held):
    """kombu's ack removes the message whichever delivery holds it, and its restore re-queues it: a
    stale copy's ack or give-back would drop or duplicate the message another worker runs."""
    from genfleet.workers.broker import settle

    mine = redis_client.zscore(KOMBU_UNACKED_INDEX, held)
    redis_client.zadd(KOMBU_UNACKED_INDEX, {held: mine + 1})  # delivered again since
    assert not settle(redis_client, held, mine) and not settle(redis_client, held, mine, requeue=True)
    assert redis_client.hexists(KOMBU_UNACKED, held) and redis_client.llen(SHORT) == 0
    assert settle(redis_client, held, mine + 1, requeue=True)
    assert not redis_client.hexists(KOMBU_UNACKED, held) and redis_client.llen(SHORT) == 1


def test_the_reaper_leaves_a_message_alone_while_its_lease_is_renewed_however_old_it_is(redis_client, held):
    keeper = LeaseKeeper(redis_client, ttl_s=5, heartbeat_s=1)
    keeper.hold(held)
    fetched_long_ago(redis_client, held)
    assert Reaper(redis_client, ttl_s=5, interval_s=1).reap_once() == []
    assert redis_client.hexists(KOMBU_UNACKED, held) and redis_client.llen(SHORT) == 0


def test_a_message_fetched_within_a_lease_is_left_alone_before_its_lease_is_written(redis_client, held):
    assert Reaper(redis_client, ttl_s=60, interval_s=1).reap_once() == []
    assert redis_client.hexists(KOMBU_UNACKED, held)


def test_an_expired_lease_gets_its_message_restored_exactly_once(redis_client, held):
    LeaseKeeper(redis_client, ttl_s=5, heartbeat_s=1).hold(held)
    fetched_long_ago(redis_client, held)
    redis_client.zadd(LEASES, {held: redis_now(redis_client) - 1})  # its worker died: nobody renews it

    reapers = [Reaper(redis_client, ttl_s=5, interval_s=1) for _ in range(2)]
    assert reapers[0].reap_once() == [held]
    assert reapers[0].reap_once() == [] and reapers[1].reap_once() == []

    assert redis_client.llen(SHORT) == 1
    assert not redis_client.hexists(KOMBU_UNACKED, held)
    assert redis_client.zscore(KOMBU_UNACKED_INDEX, held) is None and lease_left(redis_client, held) is None
    assert 0 < redis_client.pttl(REAPER_LOCK) <= 1000  # kept for the rest of the interval


def test_the_fleet_makes_one_reaper_pass_per_interval_however_many_workers_ask(redis_client, held):
    """The lock is kept until its interval ends: a lock deleted after each pass let the next
    worker's timer start another at once, and 200 workers reaped back to back."""
    reapers = [Reaper(redis_client, ttl_s=5, interval_s=0.5) for _ in range(10)]
    assert reapers[0].reap_once() == []  # nothing expired yet: this interval's pass is made
    fetched_long_ago(redis_client, held)  # ...then a worker dies
    assert [reaper.reap_once() for reaper in reapers] == [[]] * 10
    assert redis_client.llen(SHORT) == 0
    time.sleep(0.6)
    assert [reaper.reap_once() for reaper in reapers] == [[held]] + [[]] * 9


def test_a_pass_that_fails_frees_the_lock_for_another_worker(redis_client, held):
    fetched_long_ago(redis_client, held)
    failing = Reaper(redis_client, ttl_s=5, interval_s=10)

    def redis_went_away(tags):
        raise redis.ConnectionError("Connection reset by peer")

    failing._lease_expiries = redis_went_away
    with pytest.raises(redis.ConnectionError):
        failing.reap_once()
    assert redis_client.get(REAPER_LOCK) is None
    assert Reaper(redis_client, ttl_s=5, interval_s=10).reap_once() == [held]


def test_a_lease_renewed_after_the_pass_read_it_keeps_its_message(redis_client, held):
    """The race the Redis-restart chaos test once lost (a duplicated record): a worker back from an
    outage renews its leases between the pass reading them and restoring the message."""
    fetched_long_ago(redis_client, held)
    redis_client.zadd(LEASES, {held: redis_now(redis_client) - 1})  # lapsed while Redis was away
    reaper = Reaper(redis_client, ttl_s=5, interval_s=1)
    read = reaper._lease_expiries

    def read_then_renewed(tags):
        expiries = list(read(tags))  # the pass has read every lease as lapsed...
        redis_client.zadd(LEASES, {held: redis_now(redis_client) + 60})  # ...then the live worker renews
        return iter(expiries)

    reaper._lease_expiries = read_then_renewed
    assert reaper.reap_once() == []
    assert redis_client.hexists(KOMBU_UNACKED, held) and redis_client.llen(SHORT) == 0


def test_only_one_reaper_works_at_a_time(redis_client, held):
    fetched_long_ago(redis_client, held)  # no lease at all: abandoned
    redis_client.set(REAPER_LOCK, "another reaper's token")
    assert Reaper(redis_client, ttl_s=5, interval_s=1).reap_once() == []
    assert redis_client.get(REAPER_LOCK) == b"another reaper's token" and redis_client.llen(SHORT) == 0
    redis_client.delete(REAPER_LOCK)
    assert Reaper(redis_client, ttl_s=5, interval_s=1).reap_once() == [held]


def test_a_lapsed_lease_of_a_message_already_settled_is_forgotten(redis_client):
    redis_client.zadd(LEASES, {"gone-tag": redis_now(redis_client) - 600})  # its worker died after the ack
    Reaper(redis_client, ttl_s=5, interval_s=1).reap_once()
    assert redis_client.zcard(LEASES) == 0
