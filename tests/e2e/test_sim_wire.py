"""The simulated SGLang server's /generate wire format over real HTTP: cumulative and incremental
chunks, special tokens, text prompts, length finishes, stream interval, seeds, info endpoints."""
from __future__ import annotations

import itertools

import httpx
import pytest
from helpers.sim_http import FAST, chunks, generate, stream
from helpers.sim_plans import CHAT_PROMPT, plan
from helpers.sim_process import SimProcess


def test_cumulative_chunks_extend_each_other_up_to_the_planned_completion(sim, prompt, vocab):
    expected = plan(prompt, vocab)
    events = chunks(stream(sim, input_ids=prompt, sampling_params={"skip_special_tokens": False}))

    for before, after in itertools.pairwise(events):
        assert after["text"].startswith(before["text"])
        assert after["output_ids"][: len(before["output_ids"])] == before["output_ids"]
        assert after["meta_info"]["completion_tokens"] == before["meta_info"]["completion_tokens"] + 1
    assert [e["meta_info"]["finish_reason"] for e in events[:-1]] == [None] * (len(events) - 1)
    last = events[-1]
    assert last["text"] == expected.text(skip_special_tokens=False)
    assert last["output_ids"] == expected.output_ids
    assert last["meta_info"]["finish_reason"] == {"type": "stop", "matched": vocab.eos_id}
    assert last["meta_info"]["completion_tokens"] == expected.completion_tokens
    assert last["meta_info"]["reasoning_tokens"] == expected.reasoning_tokens
    assert last["meta_info"]["prompt_tokens"] == len(prompt)
    assert "e2e_latency" in last["meta_info"] and "e2e_latency" not in events[0]["meta_info"]
    assert "response_sent_to_client_ts" in events[0]["meta_info"]
    assert set(events[0]["meta_info"]) >= {
        "id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens", "reasoning_tokens",
        "weight_version", "num_retractions",
    }


def test_incremental_chunks_concatenate_to_the_planned_completion(prompt, vocab):
    expected = plan(prompt, vocab)
    with SimProcess(*FAST, "--incremental") as sim:
        events = chunks(stream(sim, input_ids=prompt, sampling_params={"skip_special_tokens": False}))
    assert len(events) == expected.completion_tokens
    assert "".join(e["text"] for e in events) == expected.text(skip_special_tokens=False)
    assert [i for e in events for i in e["output_ids"]] == expected.output_ids


def test_raw_text_splits_at_think_end_into_the_planned_reasoning_and_content(sim, prompt, vocab):
    expected = plan(prompt, vocab)
    body = generate(sim, input_ids=prompt, sampling_params={"skip_special_tokens": False}).json()
    reasoning, content = body["text"].split("</think>")
    assert (reasoning, content) == (expected.reasoning_text, expected.content_text)
    assert vocab.think_end_id in body["output_ids"]


def test_skipping_special_tokens_makes_the_think_end_marker_vanish(sim, prompt, vocab):
    expected = plan(prompt, vocab)
    body = generate(sim, input_ids=prompt).json()
    assert "</think>" not in body["text"]
    assert body["text"] == expected.reasoning_text + expected.content_text
    assert body["output_ids"] == expected.output_ids


def test_text_prompts_get_the_same_completion_as_computed_locally(sim, vocab):
    expected = plan(CHAT_PROMPT, vocab)
    body = generate(sim, text=CHAT_PROMPT, rid="text-1").json()
    assert body["output_ids"] == expected.output_ids
    assert body["meta_info"]["id"] == "text-1"
    assert body["meta_info"]["prompt_tokens"] == len(vocab.encode(CHAT_PROMPT))


def test_length_finish_cuts_at_max_new_tokens_inside_reasoning(sim, prompt, vocab):
    body = generate(sim, input_ids=prompt, sampling_params={"max_new_tokens": 3, "skip_special_tokens": False}).json()
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    assert len(body["output_ids"]) == body["meta_info"]["completion_tokens"] == 3
    assert "</think>" not in body["text"]


@pytest.mark.parametrize("interval", [1, 4, 7])
def test_stream_interval_sets_the_number_of_chunks(sim, prompt, vocab, interval):
    total = plan(prompt, vocab).completion_tokens
    events = chunks(stream(sim, input_ids=prompt, sampling_params={"stream_interval": interval}))
    assert len(events) == len(range(1, total, interval)) + 1
    assert [e["meta_info"]["completion_tokens"] for e in events] == [*range(1, total, interval), total]


def test_the_same_seed_gives_the_same_completion_in_another_process(sim, prompt):
    with SimProcess(*FAST, "--seed", "7") as seven:
        from_seed_flag = generate(seven, input_ids=prompt).json()["output_ids"]
    from_sampling_seed = generate(sim, input_ids=prompt, sampling_params={"sampling_seed": 7}).json()["output_ids"]
    from_default_seed = generate(sim, input_ids=prompt).json()["output_ids"]
    assert from_seed_flag == from_sampling_seed
    assert from_seed_flag != from_default_seed


def test_health_and_info_endpoints_answer_like_sglang(sim):
    for path in ("/health", "/health_generate"):
        response = httpx.get(sim.url + path)
        assert (response.status_code, response.content) == (200, b"")
    assert httpx.get(sim.url + "/").text == "SGLang is running"
    info = httpx.get(sim.url + "/model_info").json()
    assert info["reasoning_parser"] == "kimi_k2" and info["is_generation"] is True
    assert info["model_path"].endswith("sim/model")
    models = httpx.get(sim.url + "/v1/models").json()
    assert models["data"][0]["max_model_len"] == 32768
    assert sim.stats()["uptime_s"] > 0
