"""SGLang 0.5.23 driven the way its OpenAI server drives it, for one request.

Everything here mirrors `sglang/srt/entrypoints/openai/serving_chat.py` (0.5.23):

* force_reasoning: `template_manager.force_reasoning or _get_reasoning_from_request(request)`
  (`_process_reasoning_stream` and the non-streaming branch of `_build_chat_response`). We model
  a server whose chat template gave no reasoning toggle config (`template_manager.reasoning_config
  is None`, `force_reasoning False`), so `_get_reasoning_from_request` falls back to the
  detector's `reasoning_default`, exactly as it does for a parser-only `<think>` template.
* non-streaming: `ReasoningParser(..., stream_reasoning=False, force_reasoning=..., request=...)`
  then `parse_non_stream(text)`; the message's `reasoning_content`/`content` are those strings
  unchanged.
* streaming: one `ReasoningParser(name, request.stream_reasoning (True), force, request)` per
  choice; each delta goes through `parse_stream_chunk`, and the delta that carries the
  finish_reason is followed by `parse_stream_end()`. Every non-empty reasoning_text becomes a
  `reasoning_content` delta and every non-empty normal text a `content` delta, unchanged.
* no `--reasoning-parser` (our `none`): the server does not separate anything, content = text.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
from sglang.srt.parser.reasoning_parser import ReasoningParser
from sglang.srt.parser.reasoning_parser_names import REASONING_PARSER_NAMES

SGLANG_VERSION = "0.5.23"


def make_request(chat_template_kwargs: Mapping[str, Any] | None) -> ChatCompletionRequest:
    return ChatCompletionRequest(
        model="oracle",
        messages=[{"role": "user", "content": "hi"}],
        chat_template_kwargs=dict(chat_template_kwargs) if chat_template_kwargs is not None else None,
    )


def server_force_reasoning(parser: str, request: ChatCompletionRequest) -> bool:
    """`OpenAIServingChat._get_reasoning_from_request` with `reasoning_config is None`, or'ed with
    `template_manager.force_reasoning` (False). The parser-specific branches of that method
    (iquest_q1, minimax-m3, hunyuan) do not concern our eight names."""
    detector = ReasoningParser(model_type=parser, stream_reasoning=True).detector
    mode = detector.reasoning_default
    kwargs = request.chat_template_kwargs
    if mode is None:
        return False
    if mode == "always":
        return True
    if mode == "mistral":
        return request.reasoning_effort is not None and request.reasoning_effort != "none"
    if mode in ("thinking", "enable_thinking"):
        return not kwargs or kwargs.get(mode) is not False
    if mode in ("explicit_thinking", "explicit_enable_thinking"):
        return kwargs is not None and kwargs.get(mode.replace("explicit_", "")) is True
    return False


@dataclass(frozen=True)
class Split:
    reasoning: str
    content: str


@dataclass(frozen=True)
class StreamOutput:
    reasoning: str
    content: str
    # The SSE deltas in order: ("reasoning_content" | "content", text).
    deltas: tuple[tuple[str, str], ...]


def _parser(name: str, chat_template_kwargs, stream: bool) -> ReasoningParser:
    request = make_request(chat_template_kwargs)
    return ReasoningParser(
        model_type=name,
        stream_reasoning=request.stream_reasoning if stream else False,
        force_reasoning=server_force_reasoning(name, request),
        request=request,
    )


def non_stream(name: str, text: str, chat_template_kwargs=None) -> Split:
    if name == "none":
        return Split("", text)
    reasoning, content = _parser(name, chat_template_kwargs, stream=False).parse_non_stream(text)
    return Split(reasoning or "", content or "")


def stream(name: str, chunks: Sequence[str], chat_template_kwargs=None, flush: bool = True) -> StreamOutput:
    """The concatenated `reasoning_content` and `content` deltas of a streamed response whose
    text deltas are `chunks` (the last one carrying finish_reason='stop')."""
    if name == "none":
        return StreamOutput("", "".join(chunks), tuple(("content", c) for c in chunks if c))
    parser = _parser(name, chat_template_kwargs, stream=True)
    deltas: list[tuple[str, str]] = []
    chunks = list(chunks) or [""]
    for i, chunk in enumerate(chunks):
        reasoning, content = parser.parse_stream_chunk(chunk)
        if flush and i == len(chunks) - 1:
            end_reasoning, end_content = parser.parse_stream_end()
            reasoning = (reasoning or "") + (end_reasoning or "")
            content = (content or "") + (end_content or "")
        if reasoning:
            deltas.append(("reasoning_content", reasoning))
        if content:
            deltas.append(("content", content))
    return StreamOutput(
        "".join(t for k, t in deltas if k == "reasoning_content"),
        "".join(t for k, t in deltas if k == "content"),
        tuple(deltas),
    )


def detector_facts(name: str) -> dict[str, Any]:
    """Markers and defaults of SGLang's detector for `name`, for the reference page."""
    detector = ReasoningParser(model_type=name, stream_reasoning=True).detector
    return {
        "detector": type(detector).__name__,
        "start": detector.think_start_token,
        "end": detector.think_end_token,
        "tool_start": detector.tool_start_token,
        "reasoning_default": detector.reasoning_default,
        "default_force": detector.force_reasoning,
    }


__all__ = ["REASONING_PARSER_NAMES", "SGLANG_VERSION", "Split", "StreamOutput", "detector_facts",
           "make_request", "non_stream", "server_force_reasoning", "stream"]
