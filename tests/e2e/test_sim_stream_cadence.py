"""The simulator's chunk cadence over real HTTP, against the predictions `parse_sim_args(flags).plan(...)`
and `.stream_counts(...)` make without a server: output ids through the stop token, exact
completion lengths, the completion log, the corruption faults and --no-server-info."""
from __future__ import annotations

import itertools
from pathlib import Path

import httpx
import pytest
from helpers.sim_http import counts_of, stream_events
from helpers.sim_in_process import parse_sim_args
from helpers.sim_plans import QUESTION, chunk_sizes, prompts, template_ids
from helpers.sim_process import SimProcess, read_completion_log

RATE = ("--rate", "4000")


SPEC_FLAGS = (*RATE, "--length-tokens", "1:60", "--spec-tokens", "4", "--stream-interval", "3")


@pytest.fixture(scope="module")
def spec_sim(tmp_path_factory):
    """Incremental, speculative steps, exact lengths, logging: (process, settings, log path)."""
    log = tmp_path_factory.mktemp("log") / "completions.jsonl"
    flags = (*SPEC_FLAGS, "--incremental", "--log-completions", str(log))
    with SimProcess(*flags) as process:
        yield process, parse_sim_args(flags), log


def test_incremental_chunks_come_at_the_predicted_cadence_and_end_with_the_stop_id(spec_sim, vocab):
    sim, sim_settings, _ = spec_sim
    sizes: list[int] = []
    for index, prompt in enumerate(prompts(vocab, 12)):
        interval = 1 + index % 5
        for skip in (False, True):
            body = {"input_ids": prompt, "sampling_params": {
                "max_new_tokens": 1000, "skip_special_tokens": skip, "stream_interval": interval}}
            events = stream_events(sim, "/generate", **body)
            expected = sim_settings.plan(prompt, vocab=vocab, max_new_tokens=1000)
            predicted = sim_settings.stream_counts(expected, stream_interval=interval)
            assert counts_of(events) == predicted
            assert [len(e["output_ids"]) for e in events] == chunk_sizes(predicted)
            ids = [i for e in events for i in e["output_ids"]]
            assert ids == expected.output_ids and ids[-1] == vocab.eos_id
            assert len(ids) == events[-1]["meta_info"]["completion_tokens"] == expected.completion_tokens
            assert "".join(e["text"] for e in events) == expected.text(skip)
            assert "<|im_end|>" not in "".join(e["text"] for e in events)
            assert 1 <= expected.completion_tokens <= 60
            sizes += chunk_sizes(predicted)[1:-1]
            assert chunk_sizes(predicted)[0] == 1
            assert all(size >= interval for size in chunk_sizes(predicted)[1:-1])
    assert any(size > 5 for size in sizes)  # steps of up to 4 pass the interval


def test_a_completion_of_one_token_is_only_the_stop_token(spec_sim, vocab):
    sim, sim_settings, _ = spec_sim
    candidates = ([i, vocab.think_start_id] for i in itertools.count(100))
    prompt = next(p for p in candidates if sim_settings.plan(p, vocab=vocab).completion_tokens == 1)
    raw = {"skip_special_tokens": False}
    events = stream_events(sim, "/generate", input_ids=prompt, sampling_params=raw)
    assert len(events) == 1
    assert (events[0]["text"], events[0]["output_ids"]) == ("", [vocab.eos_id])
    assert events[0]["meta_info"]["completion_tokens"] == 1
    body = httpx.post(f"{sim.url}/generate", json={"input_ids": prompt}, timeout=30).json()
    assert (body["text"], body["output_ids"], body["meta_info"]["completion_tokens"]) == ("", [vocab.eos_id], 1)


def test_the_completion_log_holds_what_was_streamed(spec_sim, vocab):
    sim, sim_settings, log = spec_sim
    prompt = prompts(vocab, 1)[0]
    events = stream_events(sim, "/generate", input_ids=prompt, rid="logged-1",
                           sampling_params={"skip_special_tokens": False})
    plain = httpx.post(f"{sim.url}/generate", json={"text": "hello<think>", "rid": "logged-2"}, timeout=30).json()
    chat = stream_events(sim, "/v1/chat/completions", messages=QUESTION, rid="logged-3")
    unnamed = httpx.post(f"{sim.url}/v1/chat/completions", json={"messages": QUESTION}, timeout=30).json()

    lines = {line["rid"]: line for line in read_completion_log(log)}
    first = lines["logged-1"]
    assert first == {
        "rid": "logged-1", "api": "generate", "input_ids": prompt,
        "output_ids": [i for e in events for i in e["output_ids"]], "text": "".join(e["text"] for e in events),
        "finish_reason": events[-1]["meta_info"]["finish_reason"],
        "completion_tokens": events[-1]["meta_info"]["completion_tokens"],
        "stream": True, "stream_interval": 3, "incremental": True, "faults": [],
    }
    assert first["output_ids"][-1] == vocab.eos_id and len(first["output_ids"]) == first["completion_tokens"]
    second = lines["logged-2"]
    assert (second["input_text"], second["output_ids"], second["text"]) == ("hello<think>", plain["output_ids"],
                                                                            plain["text"])
    assert (second["stream"], second["incremental"], second["completion_tokens"]) == (
        False, False, plain["meta_info"]["completion_tokens"])
    third = lines["logged-3"]
    deltas = [e["choices"][0]["delta"] for e in chat if e["choices"]]
    reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    assert (third["api"], third["reasoning_content"], third["content"]) == ("chat", reasoning, content)
    assert third["text"] == reasoning + content
    expected = sim_settings.plan(third["input_ids"], vocab=vocab,
                                 max_new_tokens=sim_settings.chat_max_new_tokens(len(third["input_ids"]), None))
    assert third["output_ids"] == expected.output_ids and third["completion_tokens"] == expected.completion_tokens
    assert lines[unnamed["id"]]["content"] == (unnamed["choices"][0]["message"]["content"] or "")


def test_chat_deltas_follow_the_same_cadence(vocab, tokenizer):
    flags = (*RATE, "--length-tokens", "20:60", "--tokens-per-step", "3", "--stream-interval", "4")
    sim_settings = parse_sim_args(flags)
    with SimProcess(*flags) as sim:
        events = stream_events(sim, "/v1/chat/completions", messages=QUESTION,
                               stream_options={"continuous_usage_stats": True, "include_usage": True})
    ids = template_ids(tokenizer, QUESTION)
    expected = sim_settings.plan(ids, vocab=vocab, max_new_tokens=sim_settings.chat_max_new_tokens(len(ids), None))
    predicted = sim_settings.stream_counts(expected)
    assert all(size == 6 for size in chunk_sizes(predicted)[1:-1])  # 2 steps of 3: past the interval of 4
    delta_counts = [e["usage"]["completion_tokens"] for e in events[1:-2]]
    assert set(delta_counts) <= set(predicted) and delta_counts == sorted(delta_counts)
    assert events[-1]["usage"]["completion_tokens"] == expected.completion_tokens == predicted[-1]


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    log = tmp_path_factory.mktemp("faulty") / "completions.jsonl"
    flags = (*RATE, "--length-tokens", "2:12", "--tokens-per-step", "2", "--stream-interval", "3", "--incremental",
             "--drop-chunk-rate", "1", "--miscount-rate", "1", "--no-server-info", "--log-completions", str(log))
    with SimProcess(*flags) as process:
        yield process, parse_sim_args(flags), log


def test_drop_chunk_loses_one_non_final_chunk_and_miscount_adds_one(faulty, vocab):
    sim, sim_settings, log = faulty
    dropped_some = left_alone = 0
    for index, prompt in enumerate(prompts(vocab, 15)):
        events = stream_events(sim, "/generate", input_ids=prompt, rid=f"f{index}")
        expected = sim_settings.plan(prompt, vocab=vocab)
        predicted = sim_settings.stream_counts(expected)
        got = counts_of(events)
        assert events[-1]["meta_info"]["completion_tokens"] == expected.completion_tokens + 1  # miscount
        got[-1] -= 1
        ids = [i for e in events for i in e["output_ids"]]
        line = next(line for line in read_completion_log(log) if line["rid"] == f"f{index}")
        assert line["output_ids"] == expected.output_ids  # the log keeps the truth
        assert line["completion_tokens"] == expected.completion_tokens
        if len(predicted) - 1 < 2:  # fewer than two non-final chunks: no chunk dropped
            left_alone += 1
            assert got == predicted and ids == expected.output_ids
            assert line["faults"] == ["miscount"]
            continue
        dropped_some += 1
        (lost,) = set(predicted) - set(got)
        assert got == [c for c in predicted if c != lost] and lost != predicted[-1]
        position = predicted.index(lost)
        gone = expected.output_ids[(predicted[position - 1] if position else 0) : lost]
        assert len(ids) == expected.completion_tokens - len(gone)
        assert line["faults"] == ["drop_chunk", "miscount"]
    assert dropped_some and left_alone

    plain = httpx.post(f"{sim.url}/generate", json={"input_ids": prompts(vocab, 1)[0]}, timeout=30).json()
    assert plain["meta_info"]["completion_tokens"] == len(plain["output_ids"]) + 1
    usage = httpx.post(f"{sim.url}/v1/chat/completions", json={"messages": QUESTION}, timeout=30).json()["usage"]
    assert usage["completion_tokens"] == read_completion_log(log)[-1]["completion_tokens"] + 1
    events = stream_events(sim, "/v1/chat/completions", messages=QUESTION, rid="chat-usage",
                           stream_options={"include_usage": True})
    stream_events(sim, "/v1/chat/completions", messages=QUESTION, rid="chat-no-usage")
    lines = {line["rid"]: line for line in read_completion_log(log)}
    assert events[-1]["usage"]["completion_tokens"] == lines["chat-usage"]["completion_tokens"] + 1
    assert "miscount" in lines["chat-usage"]["faults"]
    assert "miscount" not in lines["chat-no-usage"]["faults"]  # no count was sent to be wrong


def test_no_server_info_answers_404_on_both_paths(faulty):
    sim, _, _ = faulty
    for path in ("/server_info", "/get_server_info"):
        response = httpx.get(sim.url + path, timeout=5)
        assert (response.status_code, response.json()) == (404, {"detail": "Not Found"})
    assert httpx.get(sim.url + "/model_info", timeout=5).status_code == 200


def test_server_info_reports_the_streaming_mode_on_both_paths(spec_sim):
    sim, _, _ = spec_sim
    for path in ("/server_info", "/get_server_info"):
        info = httpx.get(sim.url + path, timeout=5).json()
        assert (info["incremental_streaming_output"], info["stream_interval"]) == (True, 3)
        assert info["sim"]["steps"] == {"low": 1, "high": 4}


def test_faults_leave_a_true_log_line(tmp_path, vocab):
    log = tmp_path / "log.jsonl"
    with SimProcess(*RATE, "--length-tokens", "30:40", "--abort-rate", "1", "--log-completions", str(log)) as sim:
        events = stream_events(sim, "/generate", input_ids=prompts(vocab, 1)[0], rid="a")
        assert httpx.post(f"{sim.url}/generate", json={"input_ids": [5], "rid": "b"}, timeout=30).status_code == 503
    lines = {line["rid"]: line for line in read_completion_log(Path(log))}
    assert lines["a"]["faults"] == ["abort"] and lines["a"]["finish_reason"]["type"] == "abort"
    assert lines["a"]["output_ids"] == events[-1]["output_ids"]
    assert lines["a"]["completion_tokens"] == events[-1]["meta_info"]["completion_tokens"] < 30
    assert (lines["b"]["faults"], lines["b"]["output_ids"], lines["b"]["finish_reason"]) == (["abort"], [], None)
