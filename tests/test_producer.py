"""The producer against a real Redis: partitions, enqueue-once, rejections with file and line."""
import base64
import json

import msgpack
import pytest

from common.run_state import RunState
from producer.conversations import RowRejected, prompt_messages, to_messages
from producer.enqueue import DatasetSpec
from producer.partitioning import choose_partition, prompt_id


def queued_payloads(redis_client, queue):
    """The task payloads waiting in a Celery queue, decoded from kombu's envelope."""
    payloads = []
    for raw in redis_client.lrange(queue, 0, -1):
        envelope = json.loads(raw)
        assert envelope["content-type"] == "application/x-msgpack"
        args, _kwargs, _embed = msgpack.unpackb(base64.b64decode(envelope["body"]), raw=False)
        payloads.append(args[0])
    return payloads


def write_jsonl(path, rows):
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def test_sharegpt_and_openai_rows_become_chat_messages():
    sharegpt = {"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "q"},
                                  {"from": "gpt", "value": "a"}]}
    assert prompt_messages(to_messages(sharegpt)) == [{"role": "system", "content": "s"},
                                                      {"role": "user", "content": "q"}]
    openai = {"messages": [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"},
                           {"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}]}
    assert [m["content"] for m in prompt_messages(to_messages(openai))] == ["q1", "a1", "q2"]
    assert to_messages({"prompt": "hi"}) == [{"role": "user", "content": "hi"}]


def test_row_without_user_turn_is_rejected_with_reason():
    with pytest.raises(RowRejected, match="no user turn"):
        prompt_messages(to_messages({"messages": [{"role": "assistant", "content": "a"}]}))


def test_prompt_ids_use_the_rows_own_id_else_its_index():
    assert prompt_id("B1", {"id": "x-1"}, 7) == "B1/x-1"
    assert prompt_id("B1", {"custom_id": "req-3"}, 7) == "B1/req-3"
    assert prompt_id("B1", {}, 7) == "B1/7"


def test_partition_by_pin_or_by_total_token_need():
    assert choose_partition(10, pinned="long", max_new_tokens_short=100, long_threshold=1000) == "long"
    assert choose_partition(950, pinned=None, max_new_tokens_short=100, long_threshold=1000) == "long"
    assert choose_partition(900, pinned=None, max_new_tokens_short=100, long_threshold=1000) == "short"
    assert DatasetSpec.parse("B8=data/b8.jsonl:long").pinned == "long"
    assert DatasetSpec.parse("B1=data/b1.jsonl").pinned is None


def test_pinned_and_over_threshold_prompts_go_to_long(fleet, tmp_path, redis_client):
    short_rows = [{"prompt": "tiny question"}] * 3
    long_rows = [{"prompt": " ".join(["word"] * 400)}] * 2
    mixed = write_jsonl(tmp_path / "mixed.jsonl", short_rows + long_rows)
    pinned = write_jsonl(tmp_path / "pinned.jsonl", short_rows)
    fleet.enqueue("p", f"mixed={mixed}", f"pinned={pinned}:long",
                  extra=("--long-threshold", "300", "--max-new-tokens-short", "100"))
    short = {p["id"] for p in queued_payloads(redis_client, "short")}
    long = {p["id"] for p in queued_payloads(redis_client, "long")}
    assert short == {"mixed/0", "mixed/1", "mixed/2"}
    assert long == {"mixed/3", "mixed/4", "pinned/0", "pinned/1", "pinned/2"}
    payload = queued_payloads(redis_client, "long")[0]
    assert payload["input_ids"] and payload["prompt_tokens"] == len(payload["input_ids"])


def test_enqueueing_the_same_input_twice_enqueues_nothing_new(fleet, tmp_path, redis_client):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"question {i}"} for i in range(50)])
    fleet.enqueue("twice", f"d={data}")
    assert redis_client.llen("short") == 50
    second = fleet.enqueue("twice", f"d={data}")
    assert redis_client.llen("short") == 50
    assert RunState(redis_client, "twice").counters("d")["total"] == 50
    assert "50" in second.stdout  # reported as already queued
    # Appending rows enqueues exactly the new ones.
    write_jsonl(data, [{"prompt": f"question {i}"} for i in range(60)])
    fleet.enqueue("twice", f"d={data}")
    assert redis_client.llen("short") == 60


def test_malformed_line_is_reported_with_file_and_line_and_the_rest_enqueued(fleet, tmp_path, redis_client):
    data = write_jsonl(tmp_path / "bad.jsonl", [
        {"prompt": "fine 0"}, '{"prompt": "broken', {"prompt": "fine 2"},
        {"messages": [{"role": "assistant", "content": "no question"}]}, {"prompt": "fine 4"},
    ])
    result = fleet.enqueue("bad", f"bad={data}")
    assert f"{data}:2: invalid JSON" in result.stderr
    assert f"{data}:4: no user turn" in result.stderr
    assert {p["id"] for p in queued_payloads(redis_client, "short")} == {"bad/0", "bad/2", "bad/4"}
    state = RunState(redis_client, "bad")
    assert state.counters("bad")["rejected"] == 2
    assert state.rejections("bad")[3] == {"file": str(data), "line": 4, "reason": "no user turn"}
