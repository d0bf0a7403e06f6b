"""`genfleet enqueue` against a real Redis: partitions, enqueue-once, rejections with file and line,
the message format workers consume, the run file, the context rule, token budgets and the events
Flower sees."""
import base64
import json

from helpers.data import write_jsonl
from helpers.paths import TOKENIZER
from helpers.producer_cli import all_payloads, enqueue, queued_payloads

from genfleet.common.run_state import RunState


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


def test_every_kind_of_malformed_line_is_reported_and_counted_and_the_rest_enqueued(redis_url, redis_client,
                                                                                     tmp_path):
    lines = [
        json.dumps({"prompt": "fine"}).encode(),                                              # line 1, row 0
        b'{"messages": [{"role": "user", "content": "cut',                                    # 2: bad JSON
        json.dumps({"messages": [{"role": "system", "content": "only a system turn"}]}).encode(),  # 3
        json.dumps({"messages": [{"role": "user", "content": 42}]}).encode(),                 # 4: not a string
        b'{"prompt": "caf\xe9 latin-1"}',                                                     # 5: invalid UTF-8
        b"",                                                                                  # 6: blank, no row
        json.dumps({"conversations": [{"from": "human", "value": ["a", "list"]}]}).encode(),  # 7
        json.dumps({"text": "no known field"}).encode(),                                      # 8
        json.dumps(["not", "an", "object"]).encode(),                                         # 9
        json.dumps({"prompt": "also fine"}).encode(),                                         # 10, row 8
    ]
    data = tmp_path / "bad.jsonl"
    data.write_bytes(b"\n".join(lines) + b"\n")
    result = enqueue(redis_url, f"bad={data}", run="bad")
    for line, reason in [(2, "invalid JSON"), (3, "no user turn"), (4, "messages[0] content must be a string"),
                         (5, "invalid UTF-8"), (7, "conversations[0] text must be a string"),
                         (8, "no 'messages', 'conversations', 'body' or 'prompt' field"),
                         (9, "expected a JSON object, got list")]:
        assert f"{data}:{line}: {reason}" in result.stderr
    assert set(all_payloads(redis_client)) == {"bad/0", "bad/8"}
    state = RunState(redis_client, "bad")
    assert state.counters("bad")["rejected"] == 7 and state.counters("bad")["total"] == 2
    assert state.rejections("bad")[4]["line"] == 5
    # A re-run reports them again but counts nothing twice.
    enqueue(redis_url, f"bad={data}", run="bad")
    assert state.counters("bad")["rejected"] == 7 and redis_client.llen("short") == 2


def test_published_message_matches_what_celery_send_task_stores(redis_url, redis_client, tmp_path):
    from celery import Celery
    from kombu import Connection

    from genfleet.common.queues import GENERATE_TASK, QUEUES, SERIALIZATION

    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "hello"}])
    enqueue(redis_url, f"d={data}", run="fmt")
    ours = json.loads(redis_client.lindex("short", 0))
    # The same task sent the ordinary way, by Celery and kombu.
    celery = Celery("reference", broker=redis_url, set_as_current=False)
    celery.conf.update(**SERIALIZATION, task_queues=QUEUES, task_send_sent_event=True)
    celery.send_task(GENERATE_TASK, args=[{"x": 1}], queue="short", argsrepr="x", kwargsrepr="{}")
    theirs = json.loads(redis_client.lindex("short", 0))
    celery.close()

    def shape(value):
        return {k: shape(v) for k, v in value.items()} if isinstance(value, dict) else type(value).__name__

    for leaked in ("argsrepr", "kwargsrepr"):  # send_task copies its options into the properties too
        theirs["properties"].pop(leaked)
    for part in ("headers", "properties"):
        assert shape(ours[part]) == shape(theirs[part]), part
    assert {k: v for k, v in ours.items() if k not in ("body", "headers", "properties")} == \
           {k: v for k, v in theirs.items() if k not in ("body", "headers", "properties")}
    assert ours["properties"]["delivery_info"] == {"exchange": "", "routing_key": "short"}
    assert ours["headers"]["task"] == GENERATE_TASK and ours["headers"]["id"] == ours["properties"]["correlation_id"]
    # And kombu itself decodes ours (the oldest message, consumed first).
    with Connection(redis_url) as connection:
        queue = connection.SimpleQueue("short", serializer="msgpack", accept=["msgpack"])
        message = queue.get(timeout=5)
        args, _kwargs, _embed = message.decode()
        assert message.headers["argsrepr"] == f"d/0 short {args[0]['prompt_tokens']} prompt tokens"
        assert args[0]["id"] == "d/0" and args[0]["run"] == "fmt"
        assert args[0]["messages"] == [{"role": "user", "content": "hello"}]
        message.ack()
        queue.close()


def test_prompts_over_the_context_are_rejected_with_their_token_count_or_clipped(redis_url, redis_client,
                                                                                   tmp_path):
    rows = [{"prompt": "short question"}, {"prompt": " ".join(["word"] * 300)}]
    data = write_jsonl(tmp_path / "ctx.jsonl", rows)
    result = enqueue(redis_url, f"d={data}", "--context-length", "200", "--max-new-tokens", "100", run="reserve")
    assert f"{data}:2: prompt too long: " in result.stderr
    assert "+ 100 max new tokens > context length 200" in result.stderr
    assert set(all_payloads(redis_client)) == {"d/0"}
    assert RunState(redis_client, "reserve").counters("d")["rejected"] == 1
    redis_client.flushall()
    # "clip": a prompt that leaves room is kept, with max_new_tokens lowered to what is left.
    rows = [{"prompt": " ".join(["word"] * 120)}, {"prompt": " ".join(["word"] * 400)}]
    data = write_jsonl(tmp_path / "clip.jsonl", rows)
    result = enqueue(redis_url, f"d={data}", "--context-length", "200", "--max-new-tokens", "100",
                     "--context-rule", "clip", run="clip")
    payloads = all_payloads(redis_client)
    assert set(payloads) == {"d/0"}
    assert payloads["d/0"]["max_new_tokens"] == 200 - payloads["d/0"]["prompt_tokens"] < 100
    assert f"{data}:2: prompt too long: " in result.stderr and ">= context length 200" in result.stderr


def test_run_file_names_the_datasets_and_their_options_and_flags_override_it(redis_url, redis_client, tmp_path):
    (tmp_path / "data").mkdir()
    write_jsonl(tmp_path / "data" / "a.jsonl", [{"prompt": f"a {i}"} for i in range(5)])
    write_jsonl(tmp_path / "data" / "b.jsonl", [{"question": f"b {i}"} for i in range(3)])
    run_file = tmp_path / "run.toml"
    run_file.write_text(f"""
run = "from-file"
tokenizer = "{TOKENIZER}"
max_new_tokens_short = 500
thinking = false
[sampling]
temperature = 0.6
[datasets.a]
path = "data/a.jsonl"
max_prompts = 3
max_tokens_per_dataset = 1000
sampling = {{ top_p = 0.9 }}
[datasets.b]
path = "data/b.jsonl"
format = "prompt"
prompt_field = "question"
partition = "long"
max_new_tokens = 64
chat_template_kwargs = {{ thinking = true, enable_thinking = true }}
""")
    enqueue(redis_url, "--run-file", str(run_file), "--temperature", "0.2", run="")
    payloads = all_payloads(redis_client)
    assert set(payloads) == {"a/0", "a/1", "a/2", "b/0", "b/1", "b/2"}  # max_prompts = 3 for a
    a, b = payloads["a/0"], payloads["b/0"]
    assert a["run"] == "from-file" and a["partition"] == "short" and a["max_new_tokens"] == 500
    assert a["sampling"] == {"temperature": 0.2, "top_p": 0.9}  # the flag wins over the file
    assert a["chat_template_kwargs"] == {"thinking": False, "enable_thinking": False}
    assert a["max_tokens_per_dataset"] == 1000 and b["max_tokens_per_dataset"] is None
    assert b["partition"] == "long" and b["max_new_tokens"] == 64
    assert b["messages"] == [{"role": "user", "content": "b 0"}]
    assert b["chat_template_kwargs"] == {"thinking": True, "enable_thinking": True}
    assert RunState(redis_client, "from-file").run_manifest.budget("a") == 1000
    # Raising max_prompts on a re-run enqueues exactly the next ones.
    enqueue(redis_url, "--run-file", str(run_file), "--temperature", "0.2", "--max-prompts", "4", run="")
    assert set(all_payloads(redis_client)) == {"a/0", "a/1", "a/2", "a/3", "b/0", "b/1", "b/2"}


def test_a_run_file_with_an_unknown_key_is_refused_naming_it(redis_url, tmp_path):
    run_file = tmp_path / "run.toml"
    run_file.write_text('[datasets.a]\npath = "a.jsonl"\nmax_prompt = 3\n')
    result = enqueue(redis_url, "--run-file", str(run_file), expect_exit=2)
    assert "datasets.a.max_prompt" in result.stderr and str(run_file) in result.stderr


def test_token_budget_travels_with_every_task_and_in_the_manifest_and_cannot_change_silently(
        redis_url, redis_client, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"q{i}"} for i in range(3)])
    other = write_jsonl(tmp_path / "e.jsonl", [{"prompt": "e"}])
    enqueue(redis_url, f"d={data}", "--max-tokens-per-dataset", "5000", run="budget")
    enqueue(redis_url, f"e={other}", run="budget")  # another dataset of the run, without a budget
    payloads = all_payloads(redis_client)
    assert {p["max_tokens_per_dataset"] for k, p in payloads.items() if k.startswith("d/")} == {5000}
    assert payloads["e/0"]["max_tokens_per_dataset"] is None
    state = RunState(redis_client, "budget")
    assert state.run_manifest.budget("d") == 5000 and state.run_manifest.budget("e") is None
    refused = enqueue(redis_url, f"d={data}", "--max-tokens-per-dataset", "9000", run="budget", expect_exit=2)
    assert "d.max_tokens_per_dataset: was 5000, now 9000" in refused.stderr


def test_every_published_task_announces_itself_to_flower_with_a_task_sent_event(redis_url, redis_client, tmp_path):
    events = redis_client.pubsub()
    events.psubscribe("/0.celeryev/*")
    assert events.get_message(timeout=5)["type"] == "psubscribe"
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"q{i}"} for i in range(3)])
    enqueue(redis_url, f"d={data}", run="ev")
    task_ids = {json.loads(raw)["headers"]["id"] for raw in redis_client.lrange("short", 0, -1)}
    sent = []
    while (message := events.get_message(timeout=1)) is not None:
        assert message["channel"] == b"/0.celeryev/task.sent"
        sent.append(json.loads(base64.b64decode(json.loads(message["data"])["body"])))
    events.close()
    assert {event["uuid"] for event in sent} == task_ids
    assert {(event["type"], event["queue"], event["name"]) for event in sent} == \
           {("task-sent", "short", "genfleet.generate")}
