"""`RunState`, the one writer of a run's counters and bitmaps, against a real Redis: a publish pushes
a row once and announces it once, never a row already settled; a row settles (done or skipped)
and counts once however often its task runs; rejections count once; counters read whole."""
from __future__ import annotations

import json

import pytest
import redis

from genfleet.common import fleet_stats
from genfleet.common.queues import PARTITIONS, SHORT
from genfleet.common.redis_clock import clock_for
from genfleet.common.run_state import COUNTER_FIELDS, Outcome, OutgoingTask, RowRejection, RunState

FINISHED = Outcome(prompt_tokens=7, completion_tokens=40, reasoning_tokens=12, truncated=True,
                   empty_reasoning=False, empty_content=True)


def test_a_row_counts_once_however_many_times_its_task_finishes(redis_client):
    state = RunState(redis_client, "r")
    assert state.mark_done("d", 9, FINISHED) is True
    assert state.mark_done("d", 9, FINISHED) is False  # a worker died after writing, before acking
    counters = state.counters("d")
    assert {name: counters[name] for name in ("done", "prompt_tokens", "completion_tokens", "reasoning_tokens",
                                              "truncated", "empty_reasoning", "empty_content")} == {
        "done": 1, "prompt_tokens": 7, "completion_tokens": 40, "reasoning_tokens": 12, "truncated": 1,
        "empty_reasoning": 0, "empty_content": 1}
    assert state.is_done("d", 9) and not state.is_done("d", 8) and state.completion_tokens("d") == 40


def test_a_rows_rates_go_with_its_done_bit_once_however_many_times_its_task_finishes(redis_client):
    """The rates `status` reads are written by the script that settles the row (one round trip), so a
    task run twice adds them once, like the counters; a row already done adds nothing."""
    state = RunState(redis_client, "r")
    now = 1_700_000_000.0
    updates = fleet_stats.completion_updates("r", "d", SHORT, 40, seconds=2.0, now=now)
    assert state.mark_done("d", 9, FINISHED, updates) is True
    assert state.mark_done("d", 9, FINISHED, updates) is False
    bucket = state.keys.rate_bucket(int(now // 60))
    assert sorted(float(v) for v in redis_client.hvals(bucket)) == [1.0, 2.0, 40.0]  # prompts, seconds, tokens
    assert 0 < redis_client.ttl(bucket) <= 7200
    assert redis_client.hget(state.keys.partition_done, f"{SHORT}:d") == b"1"
    assert float(redis_client.hget(state.keys.activity, "first")) == now


def test_an_unknown_update_is_refused_before_the_row_is_settled(redis_client):
    """A row settled without its counters would never be counted: the script writes all or nothing."""
    state = RunState(redis_client, "r")
    with pytest.raises(redis.ResponseError, match="unknown update DEL"):
        state.mark_done("d", 9, FINISHED, [("DEL", state.keys.activity, "", "")])
    assert not state.is_done("d", 9) and state.counters("d")["done"] == 0


def test_rows_settle_in_their_own_bits_across_bitmap_bytes(redis_client):
    state = RunState(redis_client, "r")
    for row in (3, 9, 17, 800):  # Redis numbers bits from each byte's most significant
        state.mark_done("d", row, FINISHED)
    assert state.done_row_set("d") == {3, 9, 17, 800} and len(state.done_row_set("d")) == 4
    assert redis_client.getbit(state.keys.done("d"), 17) == 1


def test_publish_never_pushes_a_row_already_settled_done_or_skipped(redis_client):
    state = RunState(redis_client, "r")
    state.mark_done("d", 0, FINISHED)
    assert state.mark_skipped("d", 1) is True and state.mark_skipped("d", 1) is False
    tasks = [OutgoingTask(row, SHORT, f"m{row}".encode()) for row in range(3)]
    published = state.publish("d", tasks, [], queues=PARTITIONS)
    assert (published.pushed, published.claimed) == ({SHORT: 1, "long": 0}, 2)
    assert redis_client.lrange(SHORT, 0, -1) == [b"m2"]
    counters = state.counters("d")
    assert (counters["total"], counters["done"], counters["skipped"]) == (1, 1, 1)


def test_publish_announces_each_task_once_on_the_event_channel(redis_client):
    state = RunState(redis_client, "r")
    events = redis_client.pubsub()
    events.subscribe("events")
    assert events.get_message(timeout=5)["type"] == "subscribe"
    tasks = [OutgoingTask(row, SHORT, f"m{row}".encode(), f"sent {row}".encode()) for row in range(2)]
    state.publish("d", tasks, [], queues=PARTITIONS, event_channel="events")
    state.publish("d", tasks, [], queues=PARTITIONS, event_channel="events")  # a re-run: nothing new
    sent = []
    while (message := events.get_message(timeout=0.5)) is not None:
        sent.append(message["data"])
    events.close()
    assert sent == [b"sent 0", b"sent 1"]
    assert state.publish("d", [OutgoingTask(2, SHORT, b"m2", b"sent 2")], [], queues=PARTITIONS).pushed[SHORT] == 1


def test_a_rejection_counts_once_and_a_row_published_later_is_no_longer_rejected(redis_client):
    state = RunState(redis_client, "r")
    first = state.publish("d", [], [RowRejection(4, "d.jsonl", 5, "invalid JSON")], queues=PARTITIONS)
    assert first.new_rejections == 1
    again = state.publish("d", [], [RowRejection(4, "d.jsonl", 5, "invalid JSON")], queues=PARTITIONS)
    assert again.new_rejections == 0
    assert state.rejections("d") == {4: {"file": "d.jsonl", "line": 5, "reason": "invalid JSON"}}
    assert state.counters("d")["rejected"] == 1
    state.publish("d", [OutgoingTask(4, SHORT, b"fixed")], [], queues=PARTITIONS)
    assert state.rejections("d") == {} and state.counters("d")["rejected"] == 0


def test_counters_are_read_whole_and_zero_for_a_dataset_never_seen(redis_client):
    state = RunState(redis_client, "r")
    assert state.counters("nothing") == dict.fromkeys(COUNTER_FIELDS, 0)
    state.count("d", "integrity")
    state.count("d", "aborted", 3)
    counters = state.counters("d")
    assert set(counters) == set(COUNTER_FIELDS) and (counters["integrity"], counters["aborted"]) == (1, 3)
    assert RunState(redis_client, "another run").counters("d")["aborted"] == 0


def test_a_beacon_from_a_newer_worker_is_read_without_the_fields_it_added(redis_client):
    """A fleet upgraded host by host: an older `status` reads a newer worker's beacon."""
    beacon = fleet_stats.WorkerBeacon(name="w1", pool="short", slots=150, time=100.0, upstreams=[
        fleet_stats.UpstreamHealth("http://a", healthy=True, in_flight=3, target=20,
                                   load=fleet_stats.ServerLoad(running=3, waiting=1, token_usage=0.5, retracted=0,
                                                            gen_throughput=80.0))])
    raw = json.loads(beacon.to_json())
    raw["added_later"] = 1
    raw["upstreams"][0]["added_later"] = 2
    raw["upstreams"][0]["load"]["added_later"] = 3
    assert fleet_stats.WorkerBeacon.from_json(json.dumps(raw)) == beacon


def test_the_other_workers_streams_per_host_are_summed_from_their_beacons(redis_client):
    """What `--in-flight auto` adds to its own streams to know a host's pipe (workers/admission.py)."""
    now = clock_for(redis_client).now()

    def beacon(name: str, *streams: tuple[str, int]) -> fleet_stats.WorkerBeacon:
        return fleet_stats.WorkerBeacon(name=name, pool="short", slots=150, time=now, upstreams=[
            fleet_stats.UpstreamHealth(url, healthy=True, in_flight=count) for url, count in streams])

    fleet_stats.publish(redis_client, beacon("me", ("http://a", 50)))
    fleet_stats.publish(redis_client, beacon("w2", ("http://a", 30), ("http://b", 7)))
    fleet_stats.publish(redis_client, beacon("w3", ("http://a", 20)))
    assert fleet_stats.streams_to(redis_client, besides="me") == {"http://a": 50, "http://b": 7}
    assert fleet_stats.streams_to(redis_client, besides="w2") == {"http://a": 70}
