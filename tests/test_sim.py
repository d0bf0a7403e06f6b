"""The simulated SGLang server, over real HTTP: wire format, determinism, capacity and faults."""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from sim_process import SimProcess

from common.tokenizer import load_tokenizer
from sim.build_model import EXTRA_SPECIAL_TOKENS, add_extra_special_tokens
from sim.capacity import Capacity, CapacitySettings
from sim.completion import CompletionPlan, LengthModel, Opening, plan_completion
from sim.chunking import DecodeSteps
from sim.reasoning_formats import REASONING_FORMAT_NAMES
from sim.vocab import DEFAULT_TOKENIZER_DIR, SimVocab

FAST = ("--length-scale", "0.05", "--rate", "2000")
LENGTHS = LengthModel(scale=0.05)
CHAT_PROMPT = (
    "<|im_user|>user<|im_middle|>What is two plus two?<|im_end|>"
    "<|im_assistant|>assistant<|im_middle|><think>"
)
ABORT = {"type": "abort", "message": "The request queue is full.", "status_code": 503, "err_type": None}
CUDA = "CUDA error: an illegal memory access was encountered"
QUESTION = [{"role": "user", "content": "What is two plus two?"}]  # renders to CHAT_PROMPT
FORMATS = ["kimi_k2", "deepseek-r1", "qwen3", "qwen3-thinking", "glm45", "kimi", "gpt-oss", "none"]
THINK_FORMATS = ["kimi_k2", "deepseek-r1", "qwen3", "qwen3-thinking", "glm45"]
# What each format writes around reasoning and before content, after a prompt that opened <think>.
MARKERS = {
    **{name: ("", "</think>") for name in THINK_FORMATS},
    "kimi": ("◁think▷", "◁/think▷"),
    "gpt-oss": ("<|channel|>analysis<|message|>", "<|end|><|start|>assistant<|channel|>final<|message|>"),
    "none": ("", ""),
}


# -- fixtures and helpers ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def vocab() -> SimVocab:
    return SimVocab.from_tokenizer_dir()


@pytest.fixture(scope="module")
def sim():
    with SimProcess(*FAST) as process:
        yield process


@pytest.fixture(scope="module")
def prompt(vocab: SimVocab) -> list[int]:
    ids = vocab.encode(CHAT_PROMPT)
    assert ids[-1] == vocab.think_start_id
    return ids


def plan(
    prompt: list[int] | str,
    vocab: SimVocab,
    *,
    seed: int = 0,
    max_new_tokens: int = 128,  # the server's default
    lengths: LengthModel = LENGTHS,
    reasoning_format: str = "kimi_k2",
) -> CompletionPlan:
    return plan_completion(
        prompt, seed=seed, max_new_tokens=max_new_tokens, lengths=lengths, vocab=vocab,
        reasoning_format=reasoning_format,
    )


def generate(sim: SimProcess, **payload: Any) -> httpx.Response:
    return httpx.post(f"{sim.url}/generate", json=payload, timeout=30)


def stream(sim: SimProcess, path: str = "/generate", **payload: Any) -> list[str]:
    """The SSE payloads of one stream, checking the framing on the way."""
    with httpx.stream("POST", f"{sim.url}{path}", json={**payload, "stream": True}, timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
        body = response.read().decode()
    assert body.endswith("\n\n")
    events = body[:-2].split("\n\n")
    assert all(event.startswith("data: ") for event in events), body
    return [event[len("data: ") :] for event in events]


def chunks(payloads: list[str]) -> list[dict[str, Any]]:
    assert payloads[-1] == "[DONE]"
    return [json.loads(payload) for payload in payloads[:-1]]


@pytest.fixture(scope="module")
def chat_tokenizer():
    return load_tokenizer(DEFAULT_TOKENIZER_DIR)


@pytest.fixture(scope="module", params=FORMATS)
def formatted(request):
    """A server for each reasoning format: (format name, process)."""
    with SimProcess(*FAST, "--reasoning-format", request.param) as process:
        yield request.param, process


def template_ids(tokenizer: Any, messages: list[dict[str, Any]], **chat_template_kwargs: Any) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **chat_template_kwargs)
    return tokenizer.encode(text, add_special_tokens=False)


CHAT_MODEL = "sim-test"


def chat(sim: SimProcess, **payload: Any) -> httpx.Response:
    body = {"model": CHAT_MODEL, "messages": QUESTION, **payload}
    return httpx.post(f"{sim.url}/v1/chat/completions", json=body, timeout=30)


def chat_stream(sim: SimProcess, **payload: Any) -> list[dict[str, Any]]:
    return chunks(stream(sim, "/v1/chat/completions", **{"model": CHAT_MODEL, "messages": QUESTION, **payload}))


@dataclass
class ChatStream:
    reasoning: str
    content: str
    reasoning_deltas: int
    finish_reason: str
    matched_stop: int | str | None
    usage: dict[str, Any] | None


def read_chat_stream(events: list[dict[str, Any]]) -> ChatStream:
    """Checks a chat stream's shape (a role chunk, reasoning deltas, content deltas, a finish chunk
    with an empty delta, maybe a usage chunk) and returns what it carried."""
    assert len({e["id"] for e in events}) == 1 and events[0]["id"].startswith("chatcmpl-")
    assert len({e["created"] for e in events}) == 1
    assert all((e["object"], e["model"]) == ("chat.completion.chunk", CHAT_MODEL) for e in events)
    role = events[0]
    assert list(role) == ["id", "object", "created", "model", "choices"]
    assert role["choices"] == [{
        "index": 0, "delta": {"reasoning_content": None, "role": "assistant", "content": ""},
        "logprobs": None, "finish_reason": None, "matched_stop": None,
    }]
    assert list(role["choices"][0]["delta"]) == ["reasoning_content", "role", "content"]
    usage = None
    if events[-1]["choices"] == []:
        assert list(events[-1]) == ["id", "object", "created", "model", "choices", "usage"]
        usage = events.pop()["usage"]
    (finish,) = events[-1]["choices"]
    assert finish["delta"] == {"reasoning_content": None} and finish["finish_reason"] is not None
    reasoning: list[str] = []
    content: list[str] = []
    for event in events[1:-1]:
        (choice,) = event["choices"]
        assert (choice["index"], choice["logprobs"], choice["finish_reason"], choice["matched_stop"]) == (
            0, None, None, None)
        delta = choice["delta"]
        if list(delta) == ["reasoning_content"]:
            assert not content, "reasoning came after content"
            reasoning.append(delta["reasoning_content"])
        else:
            assert list(delta) == ["reasoning_content", "content"] and delta["reasoning_content"] is None
            content.append(delta["content"])
    assert all(reasoning) and all(content), "an empty delta was sent"
    return ChatStream(
        "".join(reasoning), "".join(content), len(reasoning), finish["finish_reason"], finish["matched_stop"], usage
    )


def usage_of(expected: CompletionPlan, prompt_tokens: int) -> dict[str, Any]:
    reasoning = expected.reasoning_tokens
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + expected.completion_tokens,
        "completion_tokens": expected.completion_tokens,
        "prompt_tokens_details": None,
        "reasoning_tokens": reasoning,
        "completion_tokens_details": {"reasoning_tokens": reasoning} if reasoning else None,
    }


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


# -- completions (pure) ------------------------------------------------------------------------


def test_a_smaller_budget_cuts_the_same_completion(prompt, vocab):
    full = plan(prompt, vocab, max_new_tokens=10_000)
    for budget in (0, 1, 3, full.completion_tokens - 1):
        cut = plan(prompt, vocab, max_new_tokens=budget)
        assert cut.output_ids == full.output_ids[:budget]
        assert cut.finish_reason == {"type": "length", "length": budget}
        assert cut.completion_tokens == budget


def test_completion_lengths_follow_the_lognormal_median_and_mean(vocab):
    lengths = LengthModel(median=100, mean=150)
    words = [
        plan(f"prompt {i}", vocab, max_new_tokens=100_000, lengths=lengths).completion_tokens - 3
        for i in range(3000)
    ]
    assert statistics.median(words) == pytest.approx(100, rel=0.08)
    assert statistics.mean(words) == pytest.approx(150, rel=0.1)


@pytest.mark.parametrize(
    ("tail", "opening"),
    [("<think>", Opening.INSIDE_REASONING), ("<think></think>", Opening.THINKING_OFF), ("", Opening.MODEL_OPENS)],
)
def test_the_prompt_tail_decides_who_writes_the_think_markers(vocab, tail, opening):
    text_plan = plan("hello" + tail, vocab, max_new_tokens=10_000)
    ids_plan = plan(vocab.encode("hello" + tail), vocab, max_new_tokens=10_000)
    for p in (text_plan, ids_plan):
        assert p.opening is opening
        raw = p.text(skip_special_tokens=False)
        if opening is Opening.THINKING_OFF:
            assert "think>" not in raw and p.reasoning_text == "" and p.reasoning_tokens == 0
            assert raw == p.content_text
        else:
            opened = "<think>" if opening is Opening.MODEL_OPENS else ""
            assert raw == f"{opened}{p.reasoning_text}</think>{p.content_text}"
            assert p.reasoning_tokens == len(p.reasoning_text.split()) > 0
        assert p.text(skip_special_tokens=True) == p.reasoning_text + p.content_text


def test_a_stop_finish_sends_and_counts_the_eos_but_trims_its_text(prompt, vocab):
    p = plan(prompt, vocab, max_new_tokens=10_000)
    assert p.finish_reason == {"type": "stop", "matched": vocab.eos_id}
    # sglang 0.5.23 sends output_ids_through_stop and counts them; only the text is trimmed.
    assert p.output_ids[-1] == vocab.eos_id and vocab.eos_id not in p.output_ids[:-1]
    assert p.completion_tokens == len(p.output_ids) and p.text_end == len(p.output_ids) - 1
    assert "<|im_end|>" not in p.text(skip_special_tokens=False)
    assert p.text(skip_special_tokens=False) == vocab.decode(p.output_ids[:-1], skip_special_tokens=False)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_cut_anywhere_in_any_format_is_a_prefix_of_the_whole(vocab, fmt):
    for prompt in ("hello<think>", "hello"):
        full = plan(prompt, vocab, max_new_tokens=10_000, reasoning_format=fmt)
        whole = full.text(skip_special_tokens=False)
        for budget in range(full.completion_tokens):  # one short of the stop token
            cut = plan(prompt, vocab, max_new_tokens=budget, reasoning_format=fmt)
            assert cut.output_ids == full.output_ids[:budget]
            assert cut.finish_reason == {"type": "length", "length": budget}
            assert whole.startswith(cut.text(skip_special_tokens=False))  # may end inside a marker
            assert full.reasoning_text.startswith(cut.reasoning_text)
            assert full.content_text.startswith(cut.content_text)


def test_the_marker_tokens_come_after_the_trained_vocabulary_as_special_tokens(vocab):
    tokenizer = load_tokenizer(DEFAULT_TOKENIZER_DIR)  # AutoTokenizer, local files only
    assert tokenizer.convert_tokens_to_ids(["<|im_end|>", "<think>", "</think>"]) == [2, 7, 8]
    added = list(range(3000, 3000 + len(EXTRA_SPECIAL_TOKENS)))
    assert tokenizer.convert_tokens_to_ids(EXTRA_SPECIAL_TOKENS) == added
    assert set(EXTRA_SPECIAL_TOKENS) <= set(tokenizer.all_special_tokens)
    assert [vocab.special_id(token) for token in EXTRA_SPECIAL_TOKENS] == added
    assert tokenizer.decode(added, skip_special_tokens=True) == ""


def test_adding_the_marker_tokens_to_the_trained_tokenizer_gives_the_committed_one(tmp_path):
    committed = json.loads((DEFAULT_TOKENIZER_DIR / "tokenizer.json").read_text())
    trained = {**committed, "added_tokens": [t for t in committed["added_tokens"] if t["id"] < 3000]}
    (tmp_path / "tokenizer.json").write_text(json.dumps(trained))
    assert add_extra_special_tokens(tmp_path) == EXTRA_SPECIAL_TOKENS
    assert json.loads((tmp_path / "tokenizer.json").read_text()) == committed
    config = "tokenizer_config.json"
    assert (tmp_path / config).read_text() == (DEFAULT_TOKENIZER_DIR / config).read_text()
    assert add_extra_special_tokens(tmp_path) == []  # idempotent


def test_chunks_go_out_on_the_first_token_then_every_interval():
    steps = DecodeSteps()
    assert list(steps.chunk_counts(10, 4, 0)) == [1, 5, 9]
    assert list(steps.chunk_counts(9, 4, 0)) == [1, 5]
    assert list(steps.chunk_counts(1, 1, 0)) == []
    assert steps.stream_counts(10, 4, 0) == [1, 5, 9, 10]


def test_mean_running_is_the_time_weighted_occupancy():
    now = [0.0]
    capacity = Capacity(CapacitySettings(rate=100, knee=1), clock=lambda: now[0])

    async def scenario() -> None:
        await capacity.acquire()
        now[0] = 1.0
        assert capacity.progress() == pytest.approx(50.0)  # one running: 100 / (1 + 1)
        await capacity.acquire()
        now[0] = 2.0
        assert capacity.progress() == pytest.approx(50.0 + 100 / 3)  # two running: 100 / (1 + 2)
        capacity.release()
        capacity.release()
        now[0] = 4.0

    asyncio.run(scenario())
    stats = capacity.stats()
    assert stats.mean_running == pytest.approx((1 * 1 + 2 * 1 + 0 * 2) / 4)
    assert stats.peak_running == 2 and stats.running == 0


# -- wire format -------------------------------------------------------------------------------


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


# -- reasoning formats -------------------------------------------------------------------------


def test_each_reasoning_format_writes_its_markers_around_the_planned_reasoning(formatted, prompt, vocab):
    fmt, sim = formatted
    assert list(REASONING_FORMAT_NAMES) == FORMATS  # SGLang's --reasoning-parser names
    expected = plan(prompt, vocab, max_new_tokens=1000, reasoning_format=fmt)
    opened, closed = MARKERS[fmt]
    raw = generate(sim, input_ids=prompt, sampling_params={"max_new_tokens": 1000, "skip_special_tokens": False})
    body = raw.json()
    assert body["text"] == opened + expected.reasoning_text + closed + expected.content_text
    assert body["output_ids"] == expected.output_ids
    assert (expected.reasoning_text == "") is (fmt == "none") and expected.content_text
    stop = "<|return|>" if fmt == "gpt-oss" else "<|im_end|>"
    assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": vocab.special_id(stop)}
    assert body["meta_info"]["reasoning_tokens"] == expected.reasoning_tokens

    skipped = generate(sim, input_ids=prompt, sampling_params={"max_new_tokens": 1000}).json()["text"]
    # Special tokens vanish; Harmony's header words are ordinary tokens and stay, as on SGLang.
    words = ("analysis", "assistantfinal") if fmt == "gpt-oss" else ("", "")
    assert skipped == words[0] + expected.reasoning_text + words[1] + expected.content_text
    assert skipped == expected.text(skip_special_tokens=True)
    assert httpx.get(sim.url + "/model_info").json()["reasoning_parser"] == fmt


def test_chat_streams_the_planned_reasoning_and_content_as_separate_deltas(formatted, prompt, vocab):
    fmt, sim = formatted
    # Without max_tokens the completion may run to the end of the context.
    expected = plan(prompt, vocab, max_new_tokens=32768 - len(prompt), reasoning_format=fmt)
    got = read_chat_stream(chat_stream(sim, stream_options={"include_usage": True}))
    assert (got.reasoning, got.content) == (expected.reasoning_text, expected.content_text)
    assert got.reasoning_deltas == expected.reasoning_tokens  # stream interval 1: a delta per word
    assert (got.finish_reason, got.matched_stop) == ("stop", expected.finish_reason["matched"])
    assert got.usage == usage_of(expected, len(prompt))

    body = chat(sim).json()
    assert body["choices"][0]["message"] == {
        "role": "assistant", "content": expected.content_text, "reasoning_content": expected.reasoning_text or None,
        "tool_calls": None,
    }


def test_without_separate_reasoning_everything_goes_to_content(formatted, prompt, vocab):
    fmt, sim = formatted
    expected = plan(prompt, vocab, max_new_tokens=32768 - len(prompt), reasoning_format=fmt)
    # SGLang keeps special tokens for gpt-oss, whose Harmony parser needs them.
    text = expected.text(skip_special_tokens=fmt != "gpt-oss")
    got = read_chat_stream(chat_stream(sim, separate_reasoning=False))
    assert (got.reasoning, got.content, got.usage) == ("", text, None)
    message = chat(sim, separate_reasoning=False).json()["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == (None, text)


def test_thinking_off_gives_content_only(formatted, vocab, chat_tokenizer):
    fmt, sim = formatted
    toggle = "enable_thinking" if fmt in ("qwen3", "glm45") else "thinking"
    ids = template_ids(chat_tokenizer, QUESTION, **{toggle: False})
    assert ids[-2:] == [vocab.think_start_id, vocab.think_end_id]
    expected = plan(ids, vocab, max_new_tokens=32768 - len(ids), reasoning_format=fmt)
    assert expected.reasoning_text == "" and expected.content_text

    kwargs = {"chat_template_kwargs": {toggle: False}}
    got = read_chat_stream(chat_stream(sim, **kwargs))
    assert (got.reasoning, got.reasoning_deltas, got.content) == ("", 0, expected.content_text)
    message = chat(sim, **kwargs).json()["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == (None, expected.content_text)
    raw = generate(sim, input_ids=ids, sampling_params={"max_new_tokens": 1000, "skip_special_tokens": False})
    opened = "<|channel|>final<|message|>" if fmt == "gpt-oss" else ""
    assert raw.json()["text"] == opened + expected.content_text


# -- chat completions --------------------------------------------------------------------------


def test_chat_and_generate_give_the_same_completion_for_the_templates_ids(sim, vocab, chat_tokenizer):
    conversation = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue.", "reasoning_content": "Any will do."},
        {"role": "user", "content": [{"type": "text", "text": "Another one?"}]},
    ]
    ids = template_ids(chat_tokenizer, [*conversation[:3], {"role": "user", "content": "Another one?"}])
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


# -- rejections --------------------------------------------------------------------------------


def test_an_unknown_sampling_param_is_rejected_with_400(sim, prompt):
    for stream_flag in (False, True):
        response = generate(sim, input_ids=prompt, stream=stream_flag, sampling_params={"foo": 1})
        assert response.status_code == 400
        assert response.json()["error"].startswith("unknown field `foo`, expected one of `max_new_tokens`, ")


def test_a_request_without_a_prompt_is_rejected(sim):
    response = generate(sim, sampling_params={"max_new_tokens": 4})
    assert response.status_code == 400
    assert response.json() == {"error": {"message": "Either text, input_ids or input_embeds should be provided."}}


def test_a_prompt_as_long_as_the_context_is_rejected(chat_tokenizer):
    message = "The input (16 tokens) is longer than the model's context length (16 tokens)."
    question = [{"role": "user", "content": "What is two plus two, and why?"}]
    chat_tokens = len(template_ids(chat_tokenizer, question))
    assert chat_tokens >= 16
    with SimProcess(*FAST, "--context-length", "16") as sim:
        response = generate(sim, input_ids=list(range(100, 116)))
        assert response.status_code == 400
        assert response.json() == {"error": {"message": message}}
        payloads = stream(sim, input_ids=list(range(100, 116)))
        assert generate(sim, input_ids=list(range(100, 115))).status_code == 200
        # The chat API starts its generator before answering: even a stream gets a plain 400.
        chats = [chat(sim, messages=question, stream=streaming) for streaming in (False, True)]
    error = {"error": {"message": message, "type": "invalid_request_error", "code": 400, "retryable": False}}
    assert payloads == [json.dumps(error, separators=(",", ":")), "[DONE]"]
    chat_message = f"The input ({chat_tokens} tokens) is longer than the model's context length (16 tokens)."
    for response in chats:
        assert response.status_code == 400
        assert response.json() == {
            "object": "error", "message": chat_message, "type": "BadRequestError", "param": None, "code": 400,
        }


def test_a_duplicate_rid_in_flight_is_rejected(prompt):
    with SimProcess(*FAST, "--stall-rate", "1") as sim:
        with httpx.stream("POST", f"{sim.url}/generate", json={"input_ids": prompt, "rid": "r1", "stream": True}):
            wait_until(lambda: sim.stats()["running"] == 1)
            response = generate(sim, input_ids=prompt, rid="r1")
        assert response.status_code == 400
        assert response.json() == {"error": {"message": "Duplicate request ID detected: r1"}}


# -- faults ------------------------------------------------------------------------------------


def test_http_500_fault_answers_before_any_byte(prompt):
    with SimProcess(*FAST, "--http-500-rate", "1") as sim:
        response = generate(sim, input_ids=prompt, stream=True)
        chat_response = chat(sim, stream=True)
    assert response.status_code == 500
    assert response.json() == {"error": {"message": "Internal server error"}}
    assert chat_response.status_code == 500
    assert chat_response.json() == {
        "object": "error", "message": "Internal server error", "type": "InternalServerError", "param": None,
        "code": 500,
    }


def test_abort_fault_ends_a_stream_with_an_abort_finish_and_a_plain_request_with_503(prompt, vocab):
    with SimProcess(*FAST, "--abort-rate", "1") as sim:
        events = chunks(stream(sim, input_ids=prompt))
        response = generate(sim, input_ids=prompt)
        chat_events = chat_stream(sim, stream_options={"include_usage": True})
        chat_response = chat(sim)
    assert events[-1]["meta_info"]["finish_reason"] == ABORT
    assert 1 <= events[-1]["meta_info"]["completion_tokens"] < plan(prompt, vocab).completion_tokens
    assert all(e["meta_info"]["finish_reason"] is None for e in events[:-1])
    queue_full = {"object": "error", "message": "The request queue is full.", "type": "503", "param": None, "code": 503}
    assert response.status_code == 503
    assert response.json() == queue_full

    got = read_chat_stream(chat_events)
    assert (got.finish_reason, got.matched_stop) == ("abort", None)
    assert 1 <= got.usage["completion_tokens"] < plan(prompt, vocab).completion_tokens
    assert plan(prompt, vocab).reasoning_text.startswith(got.reasoning)
    assert (chat_response.status_code, chat_response.json()) == (503, queue_full)


@pytest.mark.parametrize(
    ("error_format", "error"),
    [
        ("0.5.23", {"message": CUDA, "type": "internal_error", "code": 500, "retryable": True}),
        ("0.5.2", {"message": CUDA}),
    ],
)
def test_error_chunk_fault_sends_the_error_object_then_done(prompt, error_format, error):
    with SimProcess(*FAST, "--error-chunk-rate", "1", "--error-format", error_format) as sim:
        payloads = stream(sim, input_ids=prompt)
        if error_format == "0.5.2":  # the chat API's errors have one shape
            chat_payloads, chat_response = None, None
        else:
            chat_payloads = stream(sim, "/v1/chat/completions", model=CHAT_MODEL, messages=QUESTION)
            chat_response = chat(sim)
    assert payloads[-2:] == [json.dumps({"error": error}, separators=(",", ":")), "[DONE]"]
    assert all(json.loads(p)["meta_info"]["finish_reason"] is None for p in payloads[:-2])
    if chat_payloads is None:
        return
    chat_error = {"object": "error", "message": CUDA, "type": "InternalServerError", "param": None, "code": 500}
    assert chat_payloads[-2:] == [json.dumps({"error": chat_error}, separators=(",", ":")), "[DONE]"]
    assert all(json.loads(p)["choices"][0]["finish_reason"] is None for p in chat_payloads[:-2])
    assert (chat_response.status_code, chat_response.json()) == (500, chat_error)


@pytest.mark.parametrize("api", ["generate", "chat"])
def test_a_stalled_stream_goes_silent_and_holds_its_slot_until_the_client_leaves(prompt, api):
    path, body = ("/generate", {"input_ids": prompt}) if api == "generate" else (
        "/v1/chat/completions", {"model": CHAT_MODEL, "messages": QUESTION})
    with SimProcess(*FAST, "--stall-rate", "1") as sim:
        if api == "chat":  # load the chat template first: rejected after rendering, no fault drawn
            too_long = chat(sim, max_tokens=10**6).json()["message"]
            assert too_long == (
                "max_completion_tokens is too large: 1000000.This model supports at most 32768 completion tokens."
            )
        with httpx.stream(
            "POST", f"{sim.url}{path}", json={**body, "stream": True}, timeout=httpx.Timeout(5, read=0.5),
        ) as response:
            reader = response.iter_bytes()
            received = next(reader)
            time.sleep(0.5)  # long past the whole completion at this rate
            assert sim.stats()["running"] == 1
            with pytest.raises(httpx.ReadTimeout):  # which also drops the connection
                for data in reader:
                    received += data
        wait_until(lambda: sim.stats()["running"] == 0, timeout=2)
        assert sim.stats()["requests_disconnected"] == 1
    assert received.startswith(b"data: {") and b"[DONE]" not in received


def test_die_after_exits_the_process_abruptly():
    started = time.monotonic()
    with SimProcess(*FAST, "--die-after", "1.5") as sim:
        assert sim.wait(timeout=10) != 0
        assert 1.0 < time.monotonic() - started < 8
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{sim.url}/health", timeout=1)


# -- capacity ----------------------------------------------------------------------------------


async def _open_streams(url: str, payload: dict[str, Any], count: int, stack: contextlib.AsyncExitStack):
    client = await stack.enter_async_context(httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=None)))
    return [await stack.enter_async_context(client.stream("POST", url, json=payload)) for _ in range(count)]


def test_open_streams_are_counted_running_and_freed_when_their_clients_disconnect(prompt):
    slow = ("--rate", "20", "--length-median", "100", "--length-mean", "101")
    payload = {"input_ids": prompt, "stream": True}

    async def scenario(sim: SimProcess) -> None:
        async with contextlib.AsyncExitStack() as stack:
            responses = await _open_streams(f"{sim.url}/generate", payload, 12, stack)
            readers = [response.aiter_bytes() for response in responses]  # dropping one closes its stream
            for reader in readers:
                assert (await anext(reader)).startswith(b"data: ")
            stats = sim.stats()
            assert (stats["running"], stats["peak_running"], stats["requests_started"]) == (12, 12, 12)

    with SimProcess(*slow) as sim:
        asyncio.run(scenario(sim))
        wait_until(lambda: sim.stats()["running"] == 0, timeout=2)
        stats = sim.stats()
        assert stats["requests_disconnected"] == 12 and stats["requests_finished"] == 0
        assert 0 < stats["mean_running"] <= 12


def test_max_running_makes_further_requests_wait(prompt):
    payload = {"input_ids": prompt, "stream": True}

    async def scenario(sim: SimProcess) -> None:
        async with contextlib.AsyncExitStack() as stack:
            await _open_streams(f"{sim.url}/generate", payload, 5, stack)
            await asyncio.to_thread(wait_until, lambda: sim.stats()["waiting"] == 3)
            assert sim.stats()["running"] == 2

    with SimProcess("--rate", "20", "--max-running", "2") as sim:
        asyncio.run(scenario(sim))
        wait_until(lambda: (sim.stats()["running"], sim.stats()["waiting"]) == (0, 0), timeout=2)


def test_decode_speed_falls_as_more_requests_run(prompt, vocab):
    """Four at once with knee 4 each decode at rate / 2, so the same completion takes twice as long."""
    flags = ("--rate", "200", "--knee", "4", "--length-median", "60", "--length-mean", "61")
    tokens = plan(prompt, vocab, lengths=LengthModel(median=60, mean=61)).completion_tokens

    async def timed(url: str, count: int) -> list[float]:
        async with httpx.AsyncClient(timeout=30) as client:
            async def one() -> float:
                response = await client.post(url, json={"input_ids": prompt})
                return response.json()["meta_info"]["e2e_latency"]

            return await asyncio.gather(*(one() for _ in range(count)))

    with SimProcess(*flags) as sim:
        alone = asyncio.run(timed(f"{sim.url}/generate", 1))[0]
        together = asyncio.run(timed(f"{sim.url}/generate", 4))
        sim.reset_stats()
        assert sim.stats()["requests_finished"] == 0
    # First token with prefill, then (tokens - 1) at 200 / (1 + 1/4) = 160 tok/s, or 100 tok/s.
    assert alone == pytest.approx((tokens - 1) / 160, abs=0.06)
    assert max(together) == pytest.approx((tokens - 1) / 100, abs=0.08)
    assert min(together) > (tokens - 1) / 100 - 0.02


# -- info endpoints ----------------------------------------------------------------------------


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
