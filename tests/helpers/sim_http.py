"""Talking to the simulator over HTTP the way the wire-format tests do: requests, SSE streams with
their framing checked, and chat streams checked against SGLang's chunk shapes."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx

from genfleet.sim.completion import CompletionPlan
from helpers.sim_plans import QUESTION
from helpers.sim_process import SimProcess

# Short completions at 2,000 tok/s.
FAST = ("--length-scale", "0.05", "--rate", "2000")
CHAT_MODEL = "sim-test"
ABORT = {"type": "abort", "message": "The request queue is full.", "status_code": 503, "err_type": None}
CUDA = "CUDA error: an illegal memory access was encountered"


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


def stream_events(sim: SimProcess, path: str = "/generate", **payload: Any) -> list[dict[str, Any]]:
    """The JSON chunks of one stream (its framing checked), without the closing [DONE]."""
    return chunks(stream(sim, path, **payload))


def counts_of(events: list[dict[str, Any]]) -> list[int]:
    """The `completion_tokens` each /generate chunk reports."""
    return [event["meta_info"]["completion_tokens"] for event in events]


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

