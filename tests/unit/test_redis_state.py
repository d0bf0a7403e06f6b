"""The shared Redis contracts on their own, against a real redis-server and kombu's own code: the
bitmap codec agrees with SETBIT, RunState's publish is idempotent and counts once, dead letters
round-trip, the kombu codec reads what kombu reads and never unpickles, and the reaper restores a
message the way kombu's own restore does. Starts nothing but Redis."""
from __future__ import annotations

import base64
import json
import pickle

import pytest
from celery import Celery
from helpers.kombu_messages import encoder
from helpers.pickles import LeavesATrace
from helpers.redis_server import observer
from hypothesis import given, settings
from hypothesis import strategies as st
from kombu import Connection
from kombu.serialization import loads

from genfleet.common import kombu_wire, run_state
from genfleet.common.keys import KOMBU_UNACKED, KOMBU_UNACKED_INDEX, celery_event_channel
from genfleet.common.queues import PARTITIONS, QUEUES, SERIALIZATION, SHORT
from genfleet.common.records import TaskPayload
from genfleet.common.run_state import DeadLetter, OutgoingTask, RowRejection, RunState
from genfleet.workers.broker import NextInLine
from genfleet.workers.delivery import Reaper


@settings(max_examples=40, deadline=None)
@given(rows=st.sets(st.integers(min_value=0, max_value=4000), max_size=60),
       window=st.tuples(st.integers(0, 500), st.integers(0, 500)))
def test_the_bitmap_codec_reads_rows_exactly_as_redis_setbit_wrote_them(redis_server, rows, window):
    client = observer(redis_server)
    client.delete("bits")
    pipe = client.pipeline()
    for row in rows:
        pipe.setbit("bits", row, 1)
    pipe.execute()
    stored = client.get("bits") or b""
    assert list(run_state.set_rows(stored)) == sorted(rows)
    first, last = min(window), max(window)
    part = client.getrange("bits", first, last)
    for row in range(first * 8, (last + 1) * 8):
        assert run_state.is_set(part, row, first_byte=first) == (row in rows)
    width = max(len(stored), 1)
    assert run_state.from_int(run_state.to_int(stored, width), width) == stored.ljust(width, b"\0")


def test_publish_pushes_each_row_once_counts_once_and_a_released_row_goes_again(redis_client):
    state = RunState(redis_client, "pub")
    tasks = [OutgoingTask(0, SHORT, b"m0"), OutgoingTask(1, "long", b"m1")]
    bad = RowRejection(2, "d.jsonl", 3, "no user turn")

    first = state.publish("d", tasks, [bad], queues=PARTITIONS)
    again = state.publish("d", tasks, [bad], queues=PARTITIONS)

    assert first.pushed == {SHORT: 1, "long": 1} and first.new_rejections == 1
    assert again.pushed == {SHORT: 0, "long": 0} and again.claimed == 2 and again.new_rejections == 0
    assert state.counters("d")["total"] == 2 and state.counters("d")["rejected"] == 1
    assert state.enqueued_row_set("d") == {0, 1}

    state.release_enqueued("d", [1])
    assert state.counters("d")["total"] == 1
    fixed = state.publish("d", [OutgoingTask(2, SHORT, b"m2"), OutgoingTask(1, "long", b"m1")], [],
                          queues=PARTITIONS)
    assert fixed.pushed == {SHORT: 1, "long": 1}
    counters = state.counters("d")
    assert (counters["total"], counters["rejected"]) == (3, 0)  # row 2 published: no longer rejected
    assert redis_client.lrange("long", 0, -1) == [b"m1", b"m1"]


def test_a_dead_letter_is_recorded_once_read_back_whole_and_forgotten_on_requeue(redis_client):
    state = RunState(redis_client, "dl")
    payload = TaskPayload(run="dl", id="d/7", dataset="d", row=7, partition=SHORT, prompt_tokens=9,
                          max_new_tokens=10, messages=[{"role": "user", "content": "hi"}], attempt=3)
    state.record_dead_letter(payload, "exhausted", "HTTP 503", "http://a")
    state.record_dead_letter(payload, "exhausted", "HTTP 503", "http://a")

    (letter,) = state.read_dead_letters()
    assert letter == DeadLetter.decode(letter.id, letter.encode())
    assert (letter.id, letter.payload, letter.error_class, letter.attempts, letter.upstream) == (
        "d/7", payload, "exhausted", 3, "http://a")
    assert state.dead_letters()["d/7"]["message"] == "HTTP 503"
    assert state.counters("d")["failed"] == 1
    state.forget_dead_letter("d", "d/7")
    assert state.counters("d")["failed"] == 0 and not state.read_dead_letters()


def test_kombu_reads_the_encoded_message_and_the_codec_reads_it_back(redis_client, redis_url):
    payload = {"run": "w", "dataset": "d", "row": 5, "id": "d/5"}
    task_id, message = encoder().encode(payload, SHORT, "d/5 short 9 prompt tokens")
    assert kombu_wire.task_payload(kombu_wire.decode_queued(message)) == payload
    redis_client.lpush(SHORT, message)
    with Connection(redis_url) as connection:
        received = connection.default_channel.basic_get(SHORT, no_ack=True)
    args, _kwargs, _embed = loads(received.body, received.content_type, received.content_encoding,
                                  accept={kombu_wire.MSGPACK})
    assert args == [payload] and received.headers["id"] == task_id
    assert received.headers["argsrepr"] == "d/5 short 9 prompt tokens"


def test_the_codec_never_unpickles_a_message(tmp_path):
    trace = tmp_path / "unpickled"
    envelope = {"body": base64.b64encode(pickle.dumps(((LeavesATrace(trace),), {}, {}))).decode(),
                "content-type": "application/x-python-serialize", "content-encoding": "binary",
                "headers": {}, "properties": {"body_encoding": "base64"}}
    assert kombu_wire.task_payload(kombu_wire.decode_queued(json.dumps(envelope))) is None
    assert not trace.exists()


def test_the_reaper_restores_an_abandoned_message_as_kombu_would(redis_client, redis_url):
    _task_id, message = encoder().encode({"run": "r", "dataset": "d", "row": 1}, SHORT, "d/1")
    redis_client.lpush(SHORT, message)
    with Connection(redis_url) as connection:
        held = connection.default_channel.basic_get(SHORT, no_ack=False)  # QoS.append: unacked + index
        tag = held.delivery_tag
        assert redis_client.hexists(KOMBU_UNACKED, tag)

        assert Reaper(redis_client, ttl_s=0, interval_s=1).reap_once() == [tag]

        assert not redis_client.hexists(KOMBU_UNACKED, tag) and redis_client.zscore(KOMBU_UNACKED_INDEX, tag) is None
        again = connection.default_channel.basic_get(SHORT, no_ack=True)
    assert again.delivery_tag == tag and again.delivery_info["redelivered"] and again.headers["redelivered"]
    assert again.body == held.body
    assert redis_client.llen(SHORT) == 0  # restored once, consumed once: nothing left over


@pytest.mark.parametrize("rows", [[], [0], [7, 8, 9, 800]])
def test_row_claims_read_both_bitmaps_in_one_window(redis_client, rows):
    state = RunState(redis_client, "claims")
    for row in rows[::2]:
        redis_client.setbit(state.keys.done("d"), row, 1)
    for row in rows:
        redis_client.setbit(state.keys.enqueued("d"), row, 1)
    enqueued, done = state.row_claims("d", rows + [1000])
    assert done == set(rows[::2]) and enqueued == set(rows) - set(rows[::2])
    enqueued, done = state.row_claims("d", rows + [1000])
    assert [row for row in rows + [1000] if row not in enqueued and row not in done] == [1000]


def test_a_follow_up_next_in_line_is_the_next_message_kombu_takes_and_flower_hears_of_it(redis_client, redis_url):
    app = Celery("next-in-line-test", broker="memory://", set_as_current=False)
    app.conf.update(**SERIALIZATION, task_queues=QUEUES)
    for row in (1, 2):  # waiting before it, published as Celery does (LPUSH)
        redis_client.lpush(SHORT, encoder().encode({"run": "r", "dataset": "d", "row": row}, SHORT, f"d/{row}")[1])
    events = redis_client.pubsub()
    events.subscribe(celery_event_channel(0, kombu_wire.EVENT_ROUTING_KEY))
    events.get_message(timeout=1)  # the subscription's confirmation
    follow_up = {"run": "r", "dataset": "d", "row": 7, "id": "d/7"}
    NextInLine(app, redis_client).publish(follow_up, SHORT, "d/7 part 2")
    with Connection(redis_url) as connection:
        received = connection.default_channel.basic_get(SHORT, no_ack=True)
    args, _kwargs, _embed = loads(received.body, received.content_type, received.content_encoding,
                                  accept={kombu_wire.MSGPACK})
    assert args == [follow_up] and received.headers["argsrepr"] == "d/7 part 2"
    assert redis_client.llen(SHORT) == 2  # the two before it still wait
    sent = json.loads(base64.b64decode(json.loads(events.get_message(timeout=2)["data"])["body"]))
    assert (sent["type"], sent["uuid"], sent["queue"]) == ("task-sent", received.headers["id"], SHORT)
