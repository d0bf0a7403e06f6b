"""The simulator's chunk cadence (SGLang 0.5.23's output streamer, with multi-token decode steps),
output ids through the stop token, exact completion lengths, the completion log, the corruption
faults and --no-server-info.

Pure functions are property-tested with hypothesis; a few servers check the same over HTTP against
the predictions `parse_sim_args(flags).plan(...)` and `.stream_counts(...)` make without a server.
"""
from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_process import SimProcess

from sim.chunking import DecodeSteps, chunk_sizes
from sim.cli import parse_sim_args
from sim.completion import CompletionPlan, LengthModel, plan_completion
from sim.completion_log import read_completion_log
from sim.reasoning_formats import REASONING_FORMAT_NAMES
from sim.settings import SimSettings
from sim.vocab import SimVocab

RATE = ("--rate", "4000")
QUESTION = [{"role": "user", "content": "What is two plus two?"}]


@pytest.fixture(scope="module")
def vocab() -> SimVocab:
    return SimVocab.from_tokenizer_dir()


def prompts(vocab: SimVocab, count: int) -> list[list[int]]:
    """Prompts of every opening: inside reasoning, thinking off, model opens."""
    tails = ([vocab.think_start_id], [vocab.think_start_id, vocab.think_end_id], [])
    return [[100 + i, 200 + i, *tails[i % 3]] for i in range(count)]


# -- an oracle: SGLang's streamer, step by step --------------------------------------------------


def sglang_stream_counts(total: int, interval: int, step_sizes: Iterator[int]) -> list[int]:
    """sglang 0.5.23 `output_streamer.py` `accept()`, run once per scheduler step: prefill gives one
    token, each decode step some more (cut at the stop token); a finished request always outputs."""
    generated, sent, counts = 1, 0, []
    while True:
        if generated >= total:
            counts.append(total)
            return counts
        unsent = generated - sent
        if interval == 1 or unsent >= interval or (sent == 0 and unsent > 0):
            counts.append(generated)
            sent = generated
        generated += next(step_sizes)


def step_sizes(steps: DecodeSteps, rng_seed: int) -> Iterator[int]:
    return (b - a for a, b in itertools.pairwise(steps.boundaries(rng_seed)))


@settings(max_examples=300, deadline=None)
@given(
    total=st.integers(1, 400),
    interval=st.integers(1, 20),
    low=st.integers(1, 6),
    extra=st.integers(0, 6),
    rng_seed=st.integers(0, 2**64 - 1),
)
def test_chunk_counts_follow_sglangs_streamer_for_any_steps(total, interval, low, extra, rng_seed):
    steps = DecodeSteps(low, low + extra)
    counts = steps.stream_counts(total, interval, rng_seed)
    assert counts == sglang_stream_counts(total, interval, step_sizes(steps, rng_seed))
    sizes = chunk_sizes(counts)
    assert sizes[0] == 1 and counts[-1] == total and all(size >= 1 for size in sizes)
    # Every non-final chunk after the first carries at least the interval; a step never overshoots
    # the interval by a whole step.
    assert all(interval <= size < interval + steps.high for size in sizes[1:-1])
    assert sizes[-1] < interval + steps.high if len(sizes) > 1 else sizes == [1]


@settings(max_examples=200, deadline=None)
@given(total=st.integers(1, 300), interval=st.integers(1, 12), step=st.integers(1, 7))
def test_fixed_steps_take_the_arithmetic_shortcut_to_the_same_counts(total, interval, step):
    steps = DecodeSteps(step, step)
    assert steps.stream_counts(total, interval, 0) == sglang_stream_counts(total, interval, itertools.repeat(step))


def test_several_tokens_per_step_make_chunks_pass_the_interval():
    assert DecodeSteps(3, 3).stream_counts(20, 4, 0) == [1, 7, 13, 19, 20]  # 6 per chunk, not 4
    assert DecodeSteps(1, 1).stream_counts(20, 4, 0) == [1, 5, 9, 13, 17, 20]
    spec = DecodeSteps(1, 4)
    assert spec.stream_counts(500, 3, 7) == spec.stream_counts(500, 3, 7)  # deterministic per seed
    assert spec.stream_counts(500, 3, 7) != spec.stream_counts(500, 3, 8)
    assert max(chunk_sizes(spec.stream_counts(500, 3, 7))[1:-1]) > 3
    with pytest.raises(ValueError):
        DecodeSteps(0, 1)


# -- completions: the stop id, exact lengths -----------------------------------------------------


def check_plan(plan: CompletionPlan, vocab: SimVocab) -> None:
    """The invariants of any completion: ids through the stop, text without it."""
    assert plan.completion_tokens == len(plan.output_ids)
    if plan.finish_reason["type"] == "stop":
        stop = plan.finish_reason["matched"]
        assert plan.output_ids[-1] == stop and stop not in plan.output_ids[:-1]
        assert plan.text_end == len(plan.output_ids) - 1
    else:
        assert plan.text_end == len(plan.output_ids)
    for skip in (False, True):
        assert plan.text(skip) == vocab.decode(plan.output_ids[: plan.text_end], skip_special_tokens=skip)
    assert plan.reasoning_text == vocab.decode(
        plan.output_ids[plan.reasoning_start : plan.reasoning_end], skip_special_tokens=False)
    assert plan.content_text == vocab.decode(
        plan.output_ids[plan.content_start : plan.text_end], skip_special_tokens=False)


@settings(max_examples=300, deadline=None)
@given(
    low=st.integers(1, 40),
    span=st.integers(0, 40),
    opening=st.integers(0, 2),
    word=st.integers(100, 2000),
    seed=st.integers(0, 2**32),
    fmt=st.sampled_from(REASONING_FORMAT_NAMES),
    share=st.sampled_from([0.0, 0.3, 0.7, 1.0]),
)
def test_exact_lengths_hold_for_every_format_opening_and_length(vocab, low, span, opening, word, seed, fmt, share):
    prompt = [word, *prompts(vocab, 3)[opening][1:]]  # inside reasoning, thinking off, model opens
    lengths = LengthModel(tokens=(low, low + span), reasoning_share=share)
    full = plan_completion(prompt, seed=seed, max_new_tokens=10_000, lengths=lengths, vocab=vocab,
                           reasoning_format=fmt)
    check_plan(full, vocab)
    assert full.finish_reason["type"] == "stop"
    assert low <= full.completion_tokens <= low + span
    if full.completion_tokens == 1:
        assert full.text(False) == "" and full.output_ids == [full.finish_reason["matched"]]
    # A smaller budget cuts the same completion, one short of the stop token at most.
    budget = (seed % full.completion_tokens) if full.completion_tokens > 1 else 0
    cut = plan_completion(prompt, seed=seed, max_new_tokens=budget, lengths=lengths, vocab=vocab,
                          reasoning_format=fmt)
    check_plan(cut, vocab)
    assert cut.output_ids == full.output_ids[:budget]
    assert cut.finish_reason == {"type": "length", "length": budget}
    # Exactly the budget: it stops, as a budget of the completion's length lets it.
    again = plan_completion(prompt, seed=seed, max_new_tokens=full.completion_tokens, lengths=lengths,
                            vocab=vocab, reasoning_format=fmt)
    assert again.output_ids == full.output_ids and again.finish_reason == full.finish_reason


@settings(max_examples=100, deadline=None)
@given(word=st.integers(100, 2000), seed=st.integers(0, 2**32), fmt=st.sampled_from(REASONING_FORMAT_NAMES),
       budget=st.integers(0, 300))
def test_lognormal_completions_keep_the_stop_id_too(vocab, word, seed, fmt, budget):
    plan = plan_completion([word, vocab.think_start_id], seed=seed, max_new_tokens=budget,
                           lengths=LengthModel(scale=0.05), vocab=vocab, reasoning_format=fmt)
    check_plan(plan, vocab)


def test_exact_lengths_cover_the_range_uniformly(vocab):
    lengths = LengthModel(tokens=(1, 6))
    seen = [plan_completion([i, 7], seed=0, max_new_tokens=100, lengths=lengths, vocab=vocab).completion_tokens
            for i in range(100, 700)]
    counts = [seen.count(n) for n in range(1, 7)]
    assert sum(counts) == 600 and min(counts) > 60  # 100 each on average


def test_parse_sim_args_gives_the_settings_a_server_runs_with():
    got = parse_sim_args(["--length-tokens", "3:9", "--spec-tokens", "4", "--stream-interval", "2", "--no-server-info",
                          "--drop-chunk-rate", "0.5", "--miscount-rate", "1", "--seed", "3"])
    assert got.lengths.tokens == (3, 9) and got.steps == DecodeSteps(1, 4) and got.stream_interval == 2
    assert (got.server_info, got.seed, got.faults.drop_chunk_rate, got.faults.miscount_rate) == (False, 3, 0.5, 1.0)
    assert parse_sim_args(["--tokens-per-step", "3", "--length-tokens", "5"]).steps == DecodeSteps(3, 3)
    assert parse_sim_args(["--length-tokens", "5"]).lengths.tokens == (5, 5)
    assert parse_sim_args([]) == SimSettings(port=0)


# -- over HTTP -----------------------------------------------------------------------------------


def stream_events(url: str, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=30) as response:
        assert response.status_code == 200
        text = response.read().decode()
    payloads = [event.removeprefix("data: ") for event in text.removesuffix("\n\n").split("\n\n")]
    assert payloads[-1] == "[DONE]"
    return [json.loads(payload) for payload in payloads[:-1]]


def counts_of(events: list[dict[str, Any]]) -> list[int]:
    return [event["meta_info"]["completion_tokens"] for event in events]


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
            events = stream_events(sim.url, "/generate", body)
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
    events = stream_events(sim.url, "/generate", {"input_ids": prompt, "sampling_params": raw})
    assert len(events) == 1
    assert (events[0]["text"], events[0]["output_ids"]) == ("", [vocab.eos_id])
    assert events[0]["meta_info"]["completion_tokens"] == 1
    body = httpx.post(f"{sim.url}/generate", json={"input_ids": prompt}, timeout=30).json()
    assert (body["text"], body["output_ids"], body["meta_info"]["completion_tokens"]) == ("", [vocab.eos_id], 1)


def test_the_completion_log_holds_what_was_streamed(spec_sim, vocab):
    sim, sim_settings, log = spec_sim
    prompt = prompts(vocab, 1)[0]
    events = stream_events(sim.url, "/generate", {"input_ids": prompt, "rid": "logged-1",
                                                   "sampling_params": {"skip_special_tokens": False}})
    plain = httpx.post(f"{sim.url}/generate", json={"text": "hello<think>", "rid": "logged-2"}, timeout=30).json()
    chat = stream_events(sim.url, "/v1/chat/completions", {"messages": QUESTION, "rid": "logged-3"})
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


def test_chat_deltas_follow_the_same_cadence(vocab):
    flags = (*RATE, "--length-tokens", "20:60", "--tokens-per-step", "3", "--stream-interval", "4")
    sim_settings = parse_sim_args(flags)
    with SimProcess(*flags) as sim:
        events = stream_events(sim.url, "/v1/chat/completions", {
            "messages": QUESTION, "stream_options": {"continuous_usage_stats": True, "include_usage": True}})
    template_ids = chat_prompt_ids(QUESTION)
    expected = sim_settings.plan(template_ids, vocab=vocab,
                                 max_new_tokens=sim_settings.chat_max_new_tokens(len(template_ids), None))
    predicted = sim_settings.stream_counts(expected)
    assert all(size == 6 for size in chunk_sizes(predicted)[1:-1])  # 2 steps of 3: past the interval of 4
    delta_counts = [e["usage"]["completion_tokens"] for e in events[1:-2]]
    assert set(delta_counts) <= set(predicted) and delta_counts == sorted(delta_counts)
    assert events[-1]["usage"]["completion_tokens"] == expected.completion_tokens == predicted[-1]


def chat_prompt_ids(messages: list[dict[str, Any]]) -> list[int]:
    """The ids the sim's chat template renders the messages to (the prompt it plans for)."""
    from common.tokenizer import load_tokenizer
    from sim.vocab import DEFAULT_TOKENIZER_DIR

    tokenizer = load_tokenizer(DEFAULT_TOKENIZER_DIR)
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


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
        events = stream_events(sim.url, "/generate", {"input_ids": prompt, "rid": f"f{index}"})
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
    events = stream_events(sim.url, "/v1/chat/completions",
                           {"messages": QUESTION, "rid": "chat-usage", "stream_options": {"include_usage": True}})
    stream_events(sim.url, "/v1/chat/completions", {"messages": QUESTION, "rid": "chat-no-usage"})
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
        events = stream_events(sim.url, "/generate", {"input_ids": prompts(vocab, 1)[0], "rid": "a"})
        assert httpx.post(f"{sim.url}/generate", json={"input_ids": [5], "rid": "b"}, timeout=30).status_code == 503
    lines = {line["rid"]: line for line in read_completion_log(Path(log))}
    assert lines["a"]["faults"] == ["abort"] and lines["a"]["finish_reason"]["type"] == "abort"
    assert lines["a"]["output_ids"] == events[-1]["output_ids"]
    assert lines["a"]["completion_tokens"] == events[-1]["meta_info"]["completion_tokens"] < 30
    assert (lines["b"]["faults"], lines["b"]["output_ids"], lines["b"]["finish_reason"]) == (["abort"], [], None)
