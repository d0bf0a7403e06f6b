"""The simulator's rejections and faults over real HTTP, shaped like SGLang's: 400s for bad
requests, HTTP 500, aborts, error chunks, stalled streams, and a process that dies on cue."""
from __future__ import annotations

import json
import time

import httpx
import pytest
from helpers.sim_http import (
    ABORT,
    CHAT_MODEL,
    CUDA,
    FAST,
    chat,
    chat_stream,
    chunks,
    generate,
    read_chat_stream,
    stream,
)
from helpers.sim_plans import QUESTION, plan, template_ids
from helpers.sim_process import SimProcess
from helpers.waits import wait_until


def test_an_unknown_sampling_param_is_rejected_with_400(sim, prompt):
    for stream_flag in (False, True):
        response = generate(sim, input_ids=prompt, stream=stream_flag, sampling_params={"foo": 1})
        assert response.status_code == 400
        assert response.json()["error"].startswith("unknown field `foo`, expected one of `max_new_tokens`, ")


def test_a_request_without_a_prompt_is_rejected(sim):
    response = generate(sim, sampling_params={"max_new_tokens": 4})
    assert response.status_code == 400
    assert response.json() == {"error": {"message": "Either text, input_ids or input_embeds should be provided."}}


def test_a_prompt_as_long_as_the_context_is_rejected(tokenizer):
    message = "The input (16 tokens) is longer than the model's context length (16 tokens)."
    question = [{"role": "user", "content": "What is two plus two, and why?"}]
    chat_tokens = len(template_ids(tokenizer, question))
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
        # Freed when SGLang's abort of a left client comes, 2 s after it left (`create_abort_task`).
        wait_until(lambda: sim.stats()["running"] == 0, timeout=4)
        assert sim.stats()["requests_disconnected"] == 1
    assert received.startswith(b"data: {") and b"[DONE]" not in received


def test_die_after_exits_the_process_abruptly():
    started = time.monotonic()
    with SimProcess(*FAST, "--die-after", "1.5") as sim:
        assert sim.wait(timeout=10) != 0
        assert 1.0 < time.monotonic() - started < 8
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{sim.url}/health", timeout=1)
