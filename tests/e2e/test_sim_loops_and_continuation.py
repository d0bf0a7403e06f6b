"""The simulator's loops, aborts and continuations over real HTTP: /abort_request frees a slot at
once and ends the stream as SGLang does, a client that leaves keeps its slot decoding for 2 s,
every decoded token is counted, a cut completion continues where it was cut, and a looping
completion loops as its plan predicts."""
from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
from helpers.sim_in_process import parse_sim_args
from helpers.sim_plans import plan_continuation
from helpers.sim_process import SimProcess, read_completion_log
from helpers.waits import wait_until

ABORTED = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
# 50 tok/s, 2,000-token completions: a request runs for 40 s unless something ends it.
SLOW = ("--rate", "50", "--knee", "100000", "--length-tokens", "2000:2000")
QUICK = ("--rate", "5000", "--length-tokens", "300:400")


def events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """The JSON events of an SSE stream's lines, up to [DONE]."""
    for line in lines:
        if line.startswith("data: "):
            if line == "data: [DONE]":
                return
            yield json.loads(line[len("data: "):])


def abort(sim: SimProcess, rid: str | None, **body: Any) -> httpx.Response:
    return httpx.post(f"{sim.url}/abort_request", json={"rid": rid, **body}, timeout=5)


def test_abort_request_frees_the_slot_at_once_and_ends_the_stream_with_what_was_decoded(prompt, vocab):
    with SimProcess(*SLOW) as sim:
        body = {"input_ids": prompt, "rid": "victim", "stream": True, "sampling_params": {"max_new_tokens": 1000}}
        with httpx.stream("POST", f"{sim.url}/generate", json=body, timeout=10) as response:
            stream = events(response.iter_lines())
            seen = [next(stream) for _ in range(5)]
            assert sim.stats()["running"] == 1
            answer = abort(sim, "victim", abort_all=False)
            started = time.monotonic()
            wait_until(lambda: sim.stats()["running"] == 0, timeout=0.2, interval=0.01)
            freed_s = time.monotonic() - started
            rest = list(stream)
        stats = sim.stats()
        got = rest[-1]["output_ids"]
        continued = httpx.post(f"{sim.url}/generate", json={
            "input_ids": prompt + got, "sampling_params": {"max_new_tokens": 20}}, timeout=10).json()
    assert (answer.status_code, answer.content) == (200, b"")
    print(f"abort_request: slot free {freed_s * 1000:.0f} ms after the answer")
    last = rest[-1]["meta_info"]
    assert last["finish_reason"] == ABORTED and all(e["meta_info"]["finish_reason"] is None for e in seen + rest[:-1])
    planned = parse_sim_args(SLOW).plan(prompt, vocab=vocab, max_new_tokens=1000)
    assert got == planned.output_ids[: last["completion_tokens"]] and len(got) >= 5
    # Every decoded token counts, the aborted request's included; the abort too.
    assert stats["tokens_generated"] == last["completion_tokens"]
    assert (stats["aborted_requests"], stats["requests_finished"], stats["requests_disconnected"]) == (1, 0, 0)
    # The aborted stream continues where it was cut.
    expected = plan_continuation(parse_sim_args(SLOW), prompt, vocab=vocab, generated=len(got), max_new_tokens=20)
    assert continued["output_ids"] == expected.output_ids == planned.output_ids[len(got):len(got) + 20]


def test_a_client_that_leaves_keeps_its_slot_decoding_for_2_s_unless_aborted(prompt):
    body = {"input_ids": prompt, "stream": True, "sampling_params": {"max_new_tokens": 1000}}
    with SimProcess(*SLOW) as sim:
        for ended_by_abort in (False, True):
            sim.reset_stats()
            with httpx.stream("POST", f"{sim.url}/generate", json={**body, "rid": f"r{ended_by_abort}"}) as response:
                next(response.iter_bytes())
            left = time.monotonic()
            wait_until(lambda: sim.stats()["requests_disconnected"] == 1, timeout=1, interval=0.01)
            if ended_by_abort:  # a client that gave up on a stream gives its slot back at once
                abort(sim, "rTrue")
                # At once, not after the 2 s a left client's slot decodes on (the other branch).
                wait_until(lambda: sim.stats()["running"] == 0, timeout=1.5, interval=0.01)
                assert time.monotonic() - left < 1.5
            else:
                time.sleep(1.0)
                held = sim.stats()
                wait_until(lambda: sim.stats()["running"] == 0, timeout=3, interval=0.02)
                released_s = time.monotonic() - left
            stats = sim.stats()
            assert stats["aborted_requests"] == 1 and stats["requests_finished"] == 0
    print(f"disconnect: slot held {released_s:.2f} s")
    assert held["running"] == 1 and 1.8 <= released_s <= 2.6
    # It went on decoding after the client left, 50 tok/s for 2 s, and every token counts.
    assert held["tokens_generated"] >= 45 and stats["tokens_generated"] < 30


def test_abort_request_takes_a_request_out_of_the_queue_and_ignores_unknown_rids(prompt, vocab):
    body = {"input_ids": prompt, "stream": True, "sampling_params": {"max_new_tokens": 1000}}
    with SimProcess(*SLOW, "--max-running", "1") as sim, httpx.Client(timeout=10) as client:
        with client.stream("POST", f"{sim.url}/generate", json={**body, "rid": "first"}) as running, \
                client.stream("POST", f"{sim.url}/generate", json={**body, "rid": "second"}) as waiting:
            next(running.iter_bytes())
            wait_until(lambda: sim.stats()["waiting"] == 1, timeout=2, interval=0.01)
            assert [abort(sim, rid).status_code for rid in ("unknown", "", None)] == [200, 200, 200]
            assert (sim.stats()["running"], sim.stats()["waiting"]) == (1, 1)
            assert abort(sim, "second").status_code == 200
            (queued,) = list(events(waiting.iter_lines()))
            assert (sim.stats()["running"], sim.stats()["waiting"]) == (1, 0)
        refused = [httpx.post(f"{sim.url}/abort_request", content=b"{", timeout=5).status_code,
                   httpx.get(f"{sim.url}/abort_request", timeout=5).status_code]
    assert queued["meta_info"]["finish_reason"] == {"type": "abort", "message": "Abort in waiting queue"}
    assert (queued["output_ids"], queued["meta_info"]["completion_tokens"]) == ([], 0)
    assert refused == [400, 405]


def test_a_non_streaming_request_aborted_answers_200_and_one_left_is_aborted_at_its_next_50_tokens(prompt, vocab):
    answers: list[httpx.Response] = []
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 1000}}
    with SimProcess(*SLOW) as sim:
        asking = threading.Thread(target=lambda: answers.append(
            httpx.post(f"{sim.url}/generate", json={**body, "rid": "plain"}, timeout=30)))
        asking.start()
        wait_until(lambda: sim.stats()["running"] == 1, timeout=2, interval=0.01)
        time.sleep(0.3)
        abort(sim, "plain")
        asking.join(timeout=5)
        sim.reset_stats()
        with contextlib.suppress(httpx.ReadTimeout):  # leaves after about 15 tokens
            httpx.post(f"{sim.url}/generate", json=body, timeout=0.3)
        left = time.monotonic()
        wait_until(lambda: sim.stats()["running"] == 0, timeout=2, interval=0.01)
        released_s, stats = time.monotonic() - left, sim.stats()
    (answer,) = answers
    assert answer.status_code == 200
    result = answer.json()
    assert result["meta_info"]["finish_reason"] == ABORTED
    planned = parse_sim_args(SLOW).plan(prompt, vocab=vocab, max_new_tokens=1000)
    assert 5 <= result["meta_info"]["completion_tokens"] == len(result["output_ids"]) < 100
    assert result["output_ids"] == planned.output_ids[: len(result["output_ids"])]
    # SGLang notices at the output it sends a non-streaming request every 50 tokens (1 s at 50 tok/s).
    print(f"non-streaming disconnect: slot held {released_s:.2f} s")
    assert 50 <= stats["tokens_generated"] <= 53 and 0.4 <= released_s <= 1.2
    assert (stats["aborted_requests"], stats["requests_disconnected"]) == (1, 1)


def test_a_cut_completion_continues_where_it_was_cut_and_the_log_says_which(prompt, vocab, tmp_path):
    log = tmp_path / "completions.jsonl"
    settings = parse_sim_args(QUICK)
    with SimProcess(*QUICK, "--log-completions", str(log)) as sim, httpx.Client(timeout=10) as client:
        def ask(input_ids: list[int], max_new_tokens: int, **extra: Any) -> dict[str, Any]:
            body = {"input_ids": input_ids, "sampling_params": {"max_new_tokens": max_new_tokens}, **extra}
            if not extra.get("stream"):
                return client.post(f"{sim.url}/generate", json=body).json()
            with client.stream("POST", f"{sim.url}/generate", json=body) as response:
                return list(events(response.iter_lines()))[-1]

        first = ask(prompt, 50, rid="one")
        second = ask(prompt + first["output_ids"], 60, rid="two", stream=True)
        third = ask(prompt + first["output_ids"] + second["output_ids"], 1000, rid="three")
        fresh = ask(prompt + first["output_ids"][:-1], 10, rid="four")  # not a cut: a new prompt
    assert first["meta_info"]["finish_reason"] == {"type": "length", "length": 50}
    expected = plan_continuation(settings, prompt, vocab=vocab, generated=50, max_new_tokens=60)
    assert second["output_ids"] == expected.output_ids and second["meta_info"]["prompt_tokens"] == len(prompt) + 50
    assert second["meta_info"]["finish_reason"] == {"type": "length", "length": 60}
    assert third["meta_info"]["finish_reason"]["type"] == "stop"
    whole = settings.plan(prompt, vocab=vocab, max_new_tokens=1110)
    assert first["output_ids"] + second["output_ids"] + third["output_ids"] == whole.output_ids
    assert first["text"] + second["text"] + third["text"] == whole.text(skip_special_tokens=True)
    assert fresh["output_ids"] == settings.plan(prompt + first["output_ids"][:-1], vocab=vocab,
                                                max_new_tokens=10).output_ids
    lines = {line["rid"]: line for line in read_completion_log(log)}
    assert [lines[rid].get("continues") for rid in ("one", "two", "three", "four")] == [None, "one", "two", None]
    assert lines["two"]["output_ids"] == second["output_ids"] and lines["two"]["text"] == second["text"]


def test_a_looping_completion_loops_as_planned_and_keeps_looping_when_continued(prompt, vocab):
    flags = ("--rate", "5000", "--length-tokens", "30:40", "--loop-rate", "1", "--loop-start", "10:10",
             "--loop-period", "4:4")
    settings = parse_sim_args(flags)
    with SimProcess(*flags) as sim, httpx.Client(timeout=10) as client:
        with client.stream("POST", f"{sim.url}/generate", json={
                "input_ids": prompt, "stream": True, "sampling_params": {"max_new_tokens": 64}}) as response:
            streamed = list(events(response.iter_lines()))[-1]
        continued = client.post(f"{sim.url}/generate", json={
            "input_ids": prompt + streamed["output_ids"], "sampling_params": {"max_new_tokens": 20}}).json()
    planned = settings.plan(prompt, vocab=vocab, max_new_tokens=64)
    assert (planned.loop_start, planned.loop_period) == (10, 4)
    assert streamed["output_ids"] == planned.output_ids
    assert streamed["meta_info"]["finish_reason"] == {"type": "length", "length": 64}
    ids = streamed["output_ids"] + continued["output_ids"]
    assert len(ids) == 84 and all(ids[i] == ids[i - 4] for i in range(14, 84))
