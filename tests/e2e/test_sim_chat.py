"""The simulator's /v1/chat/completions over real HTTP: the same completion as /generate for the
template's ids, max_tokens, stream options, delta cadence, and requests checked before streaming."""
from __future__ import annotations

import itertools

import httpx
from helpers.sim_http import CHAT_MODEL, FAST, chat, chat_stream, generate, read_chat_stream, usage_of
from helpers.sim_plans import plan, template_ids
from helpers.sim_process import SimProcess


def test_chat_and_generate_give_the_same_completion_for_the_templates_ids(sim, vocab, tokenizer):
    conversation = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue.", "reasoning_content": "Any will do."},
        {"role": "user", "content": [{"type": "text", "text": "Another one?"}]},
    ]
    ids = template_ids(tokenizer, [*conversation[:3], {"role": "user", "content": "Another one?"}])
    expected = plan(ids, vocab, seed=5, max_new_tokens=40)
    before = sim.stats()
    response = chat(sim, messages=conversation, max_completion_tokens=40, seed=5, temperature=0.6,
                    some_unknown_field={"ignored": True})
    raw = generate(sim, input_ids=ids,
                   sampling_params={"max_new_tokens": 40, "sampling_seed": 5, "skip_special_tokens": False}).json()
    assert raw["output_ids"] == expected.output_ids
    body = response.json()
    assert list(body) == ["id", "object", "created", "model", "choices", "usage", "metadata"]
    assert body["object"] == "chat.completion" and body["model"] == CHAT_MODEL and body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["message"]["reasoning_content"] == expected.reasoning_text
    assert choice["message"]["content"] == (expected.content_text or None)
    finish = raw["meta_info"]["finish_reason"]
    assert (choice["finish_reason"], choice["matched_stop"]) == (finish["type"], finish.get("matched"))
    assert body["usage"] == usage_of(expected, len(ids))
    assert body["usage"]["completion_tokens"] == raw["meta_info"]["completion_tokens"]
    after = sim.stats()  # chat requests run in the same slots as /generate's
    assert after["requests_finished"] - before["requests_finished"] == 2
    assert after["tokens_generated"] - before["tokens_generated"] == 2 * expected.completion_tokens


def test_max_tokens_cuts_a_chat_completion_with_a_length_finish(sim, prompt, vocab):
    expected = plan(prompt, vocab, max_new_tokens=3)
    got = read_chat_stream(chat_stream(sim, max_tokens=3, stream_options={"include_usage": True}))
    assert (got.reasoning, got.content) == (expected.reasoning_text, "")
    assert (got.finish_reason, got.matched_stop) == ("length", None)
    assert got.usage["completion_tokens"] == 3
    choice = chat(sim, max_tokens=3).json()["choices"][0]
    assert (choice["finish_reason"], choice["matched_stop"], choice["message"]["content"]) == ("length", None, None)


def test_stream_options_and_stream_reasoning_shape_the_chunks(sim, prompt, vocab):
    expected = plan(prompt, vocab, max_new_tokens=32768 - len(prompt))
    held = read_chat_stream(chat_stream(sim, stream_reasoning=False))
    assert (held.reasoning, held.reasoning_deltas, held.content) == (
        expected.reasoning_text, 1, expected.content_text)

    events = chat_stream(sim, stream_options={"continuous_usage_stats": True}, model=None)
    assert {e["model"] for e in events} == {"default"}  # SGLang's name when none is given
    deltas = [e for e in events[1:-1]]
    generated = [e["usage"]["completion_tokens"] for e in deltas]
    assert generated == sorted(generated) and generated[-1] <= expected.completion_tokens
    assert all(e["usage"]["prompt_tokens"] == len(prompt) for e in deltas)
    assert "usage" not in events[0] and "usage" not in events[-1]


def test_chat_deltas_follow_the_stream_interval_even_across_multi_token_markers(prompt, vocab):
    expected = plan(prompt, vocab, max_new_tokens=32768 - len(prompt), reasoning_format="gpt-oss")
    with SimProcess(*FAST, "--reasoning-format", "gpt-oss", "--stream-interval", "5") as sim:
        got = read_chat_stream(chat_stream(sim))
    assert (got.reasoning, got.content) == (expected.reasoning_text, expected.content_text)
    # A chunk goes out at the first token and then every 5; each one that holds reasoning
    # words carries one reasoning delta (chunks of marker ids alone carry none).
    bounds = [0, *range(1, expected.completion_tokens, 5), expected.completion_tokens]
    start, end = expected.reasoning_start, expected.reasoning_end
    assert got.reasoning_deltas == sum(1 for a, b in itertools.pairwise(bounds) if max(a, start) < min(b, end))


def test_chat_requests_are_checked_before_anything_streams(sim):
    for streaming in (False, True):
        response = chat(sim, messages=[], stream=streaming)
        assert response.status_code == 400
        assert response.json() == {
            "object": "error", "message": "Messages cannot be empty.", "type": "BadRequestError", "param": None,
            "code": 400,
        }
        response = chat(sim, stream=streaming, separate_reasoning="yes")
        assert response.status_code == 400 and response.json()["type"] == "Bad Request"
    missing = httpx.post(f"{sim.url}/v1/chat/completions", json={"model": "m"}, timeout=30)
    assert missing.status_code == 400 and "messages" in missing.json()["message"]
    assert httpx.get(f"{sim.url}/v1/chat/completions").status_code == 405
