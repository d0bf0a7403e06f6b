"""The workers' check for prompts nobody holds (`workers/delivery.py`) against a real Redis: a
prompt whose message is gone is reported once two checks in a row found it, never one that is
queued, in transit, held, done or dead; when the counts agree no message is read at all."""
from __future__ import annotations

import json

import pytest
from helpers.kombu_messages import encoder

from genfleet.common.keys import KOMBU_UNACKED, TRANSITS, UNACCOUNTED_CHECK, transit_list
from genfleet.common.queues import PARTITIONS, SHORT
from genfleet.common.records import TaskPayload
from genfleet.common.run_state import Outcome, OutgoingTask, RunState
from genfleet.workers import delivery

DONE = Outcome(prompt_tokens=1, completion_tokens=1, reasoning_tokens=0, truncated=False, empty_reasoning=False,
               empty_content=False)


def publish(client, rows: range, run: str = "r", dataset: str = "d") -> None:
    state = RunState(client, run)
    state.register_dataset(dataset, "d.jsonl")
    codec = encoder()
    payloads = [{"run": run, "dataset": dataset, "row": row, "id": f"{dataset}/{row}"} for row in rows]
    tasks = [OutgoingTask(p["row"], SHORT, codec.encode(p, SHORT, p["id"])[1]) for p in payloads]
    state.publish(dataset, tasks, [], queues=PARTITIONS)


def take(client) -> dict:
    """The next message off the short queue, as a consumer takes it."""
    return json.loads(client.rpop(SHORT))


def no_message_read(monkeypatch) -> None:
    monkeypatch.setattr(delivery.kombu_wire, "held_messages", lambda *_: pytest.fail("read the messages"))


def test_when_every_pending_prompt_has_a_message_the_check_reads_none(redis_client, monkeypatch):
    publish(redis_client, range(5))
    no_message_read(monkeypatch)
    assert delivery.check(redis_client) == {} and RunState(redis_client, "r").unaccounted() == {}


def test_a_lost_message_is_reported_by_the_second_check_and_then_kept_without_reading_again(redis_client,
                                                                                            monkeypatch):
    publish(redis_client, range(5))
    take(redis_client)  # popped by a worker that died before recording it (kombu's own BRPOP)
    assert delivery.check(redis_client) == {}, "one sighting could be a message on its way"
    assert delivery.check(redis_client) == {"r": {"d": 1}}
    assert RunState(redis_client, "r").unaccounted() == {"d": 1}
    no_message_read(monkeypatch)
    assert delivery.check(redis_client) == {"r": {"d": 1}}


def test_queued_in_transit_held_done_and_dead_prompts_are_accounted_for(redis_client):
    publish(redis_client, range(6))
    state = RunState(redis_client, "r")
    lost = take(redis_client)  # row 0
    held = take(redis_client)
    redis_client.hset(KOMBU_UNACKED, held["properties"]["delivery_tag"], json.dumps([held, "short", "short"]))
    in_transit = transit_list(SHORT, "c1")
    redis_client.zadd(TRANSITS, {in_transit: 0})
    redis_client.lpush(in_transit, json.dumps(take(redis_client)))
    take(redis_client)  # row 3: done, and acked
    state.mark_done("d", 3, DONE)
    take(redis_client)  # row 4: dead-lettered, and acked
    state.record_dead_letter(TaskPayload.from_dict(state_payload(4)), "permanent", "bad prompt", None)
    delivery.check(redis_client)
    assert delivery.check(redis_client) == {"r": {"d": 1}}
    assert lost["headers"]["argsrepr"] == "d/0"


def state_payload(row: int) -> dict:
    return {"id": f"d/{row}", "run": "r", "dataset": "d", "row": row, "partition": SHORT, "prompt_tokens": 1,
            "max_new_tokens": 8, "messages": [{"role": "user", "content": "q"}]}


def test_a_report_is_dropped_once_the_prompts_are_recovered(redis_client):
    publish(redis_client, range(3))
    take(redis_client)
    delivery.check(redis_client)
    delivery.check(redis_client)
    RunState(redis_client, "r").mark_done("d", 0, DONE)  # recover-lost published it, a worker did it
    assert delivery.check(redis_client) == {}
    assert not redis_client.exists(RunState(redis_client, "r").keys.unaccounted)


def test_one_check_per_interval_fleet_wide(redis_client):
    publish(redis_client, range(2))
    assert delivery.check_if_due(redis_client, 300) == {}
    assert delivery.check_if_due(redis_client, 300) is None
    assert 0 < redis_client.ttl(UNACCOUNTED_CHECK) <= 300


def test_a_message_seen_missing_once_that_turns_up_again_is_forgotten(redis_client):
    publish(redis_client, range(3))
    raw = redis_client.rpop(SHORT)  # on its way between two lists while the check read them
    assert delivery.check(redis_client) == {}
    redis_client.rpush(SHORT, raw)
    assert delivery.check(redis_client) == {}
    assert not redis_client.exists(RunState(redis_client, "r").keys.unaccounted)
