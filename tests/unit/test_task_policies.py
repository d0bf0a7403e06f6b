"""The generation policies on the real task body in process (`helpers/task_harness.py`), against a
simulated server over real HTTP, its follow-up tasks run in turn as the pools would: a cut completion
continued is exactly the server's parts joined (and the completion of the larger budget asked at
once), `regenerate` asks again from scratch with the larger budget, and staged first caps give the
completions of the full cap. Each record is checked against the simulator's own completion log."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from helpers.data import read_jsonl
from helpers.fleet import shard_records
from helpers.task_harness import ThreadedSim, prompt_payload, run_task, sim_on_a_socket, worker_runtime

from genfleet.common.reasoning import split_reasoning
from genfleet.common.records import TaskPayload
from genfleet.workers.runtime import WorkerRuntime

THREADS = 8


def run_to_the_end(payload: TaskPayload, runtime: WorkerRuntime) -> list[TaskPayload]:
    """The task, then every follow-up it publishes, in turn; returns the follow-ups."""
    follow_ups, pending = [], [payload]
    while pending:
        _, published = run_task(pending.pop(0), runtime)
        follow_ups += published
        pending += published
    return follow_ups


def run_all(payloads: list[TaskPayload], runtime: WorkerRuntime) -> list[list[TaskPayload]]:
    with ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(lambda payload: run_to_the_end(payload, runtime), payloads))


def planned_ids(sim: ThreadedSim, payload: TaskPayload, max_new_tokens: int) -> list[int]:
    """What the simulator generates for `payload` asked `max_new_tokens` at once."""
    return sim.server.settings.plan(payload.input_ids, vocab=sim.server.vocab,
                                    max_new_tokens=max_new_tokens).output_ids


def test_a_cut_completion_continued_is_the_two_parts_joined_byte_for_byte(redis_url, tmp_path, tokenizer):
    flags = ("--length-tokens", "300:400", "--stream-interval", "16")
    log_path = tmp_path / "completions.jsonl"
    payloads = [prompt_payload(tokenizer, "c", "c", n, f"question {n}", keep_token_ids=True, max_new_tokens=128,
                               on_truncated="continue", max_new_tokens_total=1000) for n in range(12)]
    with sim_on_a_socket(*flags, "--rate", "5000", "--log-completions", str(log_path)) as sim, \
            worker_runtime(redis_url, tmp_path / "out", sim.url, stream_interval=16) as runtime:
        follow_ups = run_all(payloads, runtime)
        runtime.shards.close()

    assert all(len(parts) == 1 and parts[0].partition == "long" for parts in follow_ups)
    by_input = {tuple(line["input_ids"]): line for line in read_jsonl(log_path)}
    records = {record["id"]: record for record in shard_records(tmp_path / "out", "c")}
    assert len(records) == 12
    for payload in payloads:
        record, first = records[payload.id], by_input[tuple(payload.input_ids)]
        assert first["finish_reason"]["type"] == "length" and len(first["output_ids"]) == 128
        second = by_input[tuple(payload.input_ids + first["output_ids"])]
        assert second["continues"] == first["rid"]
        assert record["output_ids"] == first["output_ids"] + second["output_ids"]
        assert record["continued"] == 1 and record["finish_reason"] == "stop"
        split = split_reasoning(first["text"] + second["text"], "kimi_k2")
        marker = "</think>" if split.closed else ""
        assert record["reasoning"] + marker + record["content"] == first["text"] + second["text"]
        # Statistically the same as asking the larger budget at once: here, the very same completion.
        assert record["output_ids"] == planned_ids(sim, payload, 1000)
        assert record["partition"] == "long" and record["usage"]["completion_tokens"] == len(record["output_ids"])


def test_regenerate_asks_again_from_scratch_with_the_larger_budget(redis_url, tmp_path, tokenizer):
    log_path = tmp_path / "completions.jsonl"
    payloads = [prompt_payload(tokenizer, "r", "r", n, f"question {n}", max_new_tokens=128,
                               on_truncated="regenerate", max_new_tokens_total=1000) for n in range(8)]
    with sim_on_a_socket("--length-tokens", "300:400", "--rate", "5000", "--log-completions", str(log_path)) \
            as sim, worker_runtime(redis_url, tmp_path / "out", sim.url) as runtime:
        follow_ups = run_all(payloads, runtime)
        runtime.shards.close()

    assert all(len(parts) == 1 and parts[0].regenerated and parts[0].max_new_tokens == 1000 for parts in follow_ups)
    log = read_jsonl(log_path)
    assert len(log) == 16 and {tuple(line["input_ids"]) for line in log} == {tuple(p.input_ids) for p in payloads}
    assert sorted(line["completion_tokens"] for line in log)[:8] == [128] * 8
    records = shard_records(tmp_path / "out", "r")
    assert len(records) == 8 and all(r["regenerated"] and r["finish_reason"] == "stop" for r in records)


def test_staged_first_caps_give_the_completions_of_the_full_cap_asked_at_once(redis_url, tmp_path, tokenizer):
    """`--first-max-new-tokens auto`, still at its start value: every first request asks 64 new
    tokens; those cut there go on in their own queue to the real cap, and each record is the sim's
    completion for the full cap, whichever way it was reached."""
    flags = ("--length-tokens", "20:300", "--stream-interval", "8")
    log_path = tmp_path / "completions.jsonl"
    payloads = [prompt_payload(tokenizer, "s", "s", n, f"question {n}", keep_token_ids=True, max_new_tokens=250,
                               first_max_new_tokens="auto") for n in range(24)]
    with sim_on_a_socket(*flags, "--rate", "5000", "--log-completions", str(log_path)) as sim, \
            worker_runtime(redis_url, tmp_path / "out", sim.url, stream_interval=8, first_cap_start=64,
                           first_cap_min_samples=1000) as runtime:
        run_all(payloads, runtime)
        runtime.shards.close()

    first_requests = {tuple(line["input_ids"]): line for line in read_jsonl(log_path)}
    records = {r["id"]: r for r in shard_records(tmp_path / "out", "s")}
    assert len(records) == 24
    for payload in payloads:
        record, expected = records[payload.id], planned_ids(sim, payload, 250)
        assert record["output_ids"] == expected
        assert record["finish_reason"] == ("length" if len(expected) == 250 else "stop")
        assert len(first_requests[tuple(payload.input_ids)]["output_ids"]) == min(64, len(expected))
        assert record.get("continued") == (1 if len(expected) > 64 else None)
        assert record["partition"] == "short"
    assert 0 < sum(1 for r in records.values() if r.get("continued")) < 24  # both kinds were there
