"""Each reasoning format the simulator speaks (SGLang's --reasoning-parser names), over real HTTP:
its markers around the planned reasoning on /generate, separate reasoning and content deltas on
/v1/chat/completions, everything in content without separate_reasoning, thinking turned off."""
from __future__ import annotations

import httpx
import pytest
from helpers.sim_http import FAST, chat, chat_stream, generate, read_chat_stream, usage_of
from helpers.sim_plans import FORMATS, QUESTION, THINK_FORMATS, plan, template_ids
from helpers.task_harness import sim_on_a_socket

from genfleet.sim.completion import REASONING_FORMAT_NAMES

MARKERS = {
    **{name: ("", "</think>") for name in THINK_FORMATS},
    "kimi": ("◁think▷", "◁/think▷"),
    "gpt-oss": ("<|channel|>analysis<|message|>", "<|end|><|start|>assistant<|channel|>final<|message|>"),
    "none": ("", ""),
}


@pytest.fixture(scope="module", params=FORMATS)
def formatted(request):
    """A server for each reasoning format: (format name, process)."""
    with sim_on_a_socket(*FAST, "--reasoning-format", request.param) as process:
        yield request.param, process


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


def test_thinking_off_gives_content_only(formatted, vocab, tokenizer):
    fmt, sim = formatted
    toggle = "enable_thinking" if fmt in ("qwen3", "glm45") else "thinking"
    ids = template_ids(tokenizer, QUESTION, **{toggle: False})
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
