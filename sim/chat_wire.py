"""SGLang 0.5.23 `/v1/chat/completions` bytes: chunks, the non-streaming response, error bodies.

The server splits reasoning from content itself. The plan knows which output ids are reasoning
words, content words and markers, so each delta is the exact text a perfect parser recovers:
`reasoning_content` deltas concatenate to the plan's reasoning, `content` deltas to its content.
Like `/generate`'s, chunks are byte slices of texts escaped once per request.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from genfleet.sim.completion import CompletionPlan
from genfleet.sim.wire import (
    CUDA_ERROR,
    DEFAULT_WEIGHT_VERSION,
    QUEUE_FULL,
    dumps,
    http_exception_body,
    sse,
    unescape,
    weight_versions,
)

INTERNAL_ERROR_TYPE = "InternalServerError"
BAD_REQUEST_TYPE = "BadRequestError"


def openai_error(message: str, *, err_type: str, code: int) -> dict[str, Any]:
    """SGLang's ErrorResponse, the body of the chat API's errors."""
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": code}


def openai_error_body(message: str, *, err_type: str = BAD_REQUEST_TYPE, code: int = 400) -> bytes:
    return dumps(openai_error(message, err_type=err_type, code=code))


@dataclass(frozen=True)
class ChatOptions:
    """How one request wants its chat completion shaped."""

    completion_id: str
    created: int
    model: str
    prompt_tokens: int
    # Reasoning in `reasoning_content`, markers dropped; else all text goes to `content`.
    separate_reasoning: bool
    skip_special_tokens: bool
    stream_reasoning: bool = True
    include_usage: bool = False
    continuous_usage_stats: bool = False
    # --enable-cache-report: usage reports the cached prompt tokens (else prompt_tokens_details is
    # null; sglang 0.5.23 `entrypoints/openai/usage_processor.py`).
    cache_report: bool = False
    weight_version: str = DEFAULT_WEIGHT_VERSION  # the launch's --weight-version


class _Span:
    """The escaped text of output ids [start, stop), sliceable by token range."""

    def __init__(self, pieces: list[bytes], start: int) -> None:
        self.start, self.stop = start, start + len(pieces)
        self._text = memoryview(b"".join(pieces))
        self._ends = [0, *accumulate(map(len, pieces))]

    def between(self, first: int, last: int) -> bytes:
        """The text of the span's ids among output ids [first, last)."""
        low, high = max(first, self.start) - self.start, min(last, self.stop) - self.start
        return bytes(self._text[self._ends[low] : self._ends[high]]) if high > low else b""


class ChatFrames:
    """The chat API's bytes for one request, at any number of generated tokens."""

    def __init__(self, plan: CompletionPlan, *, table: tuple[bytes, ...], options: ChatOptions) -> None:
        self.plan = plan
        self._options = options
        ids = plan.output_ids
        # A matched stop token (the last id) has no text: the detokenizer trims it before the chat
        # layer sees the text (sglang 0.5.23 `managers/detokenizer_manager.py` `trim_matched_stop`).
        text_end = plan.text_end
        if options.separate_reasoning:
            reasoning_ids = ids[plan.reasoning_start : plan.reasoning_end]
            self._reasoning = _Span([table[i] for i in reasoning_ids], plan.reasoning_start)
            self._content = _Span([table[i] for i in ids[plan.content_start : text_end]], plan.content_start)
        else:
            self._reasoning = _Span([], 0)
            self._content = _Span([table[i] for i in ids[:text_end]], 0)
        self._output_len = len(ids)
        self._shown = 0
        self.cached_tokens = 0  # set by the engine at the prefill (sim.prefix_cache)
        self._held = b""  # reasoning kept back until it closes, without stream_reasoning
        self._started = False
        self._head = (
            b'data: {"id":' + dumps(options.completion_id) + b',"object":"chat.completion.chunk","created":%d'
            % options.created + b',"model":' + dumps(options.model) + b',"choices":['
        )

    # -- streaming ----------------------------------------------------------------------------

    def chunk(self, generated: int, *, finish: dict[str, Any] | None = None, count_bias: int = 0) -> bytes:
        """The events after `generated` tokens: the role first, then the reasoning and content
        deltas; with `finish`, also the finish chunk and the usage chunk."""
        events = []
        if not self._started:
            self._started = True
            events.append(self._choice(b'{"reasoning_content":null,"role":"assistant","content":""}'))
        shown = min(generated, self._output_len)
        first, self._shown = self._shown, shown
        reasoning = self._held + self._reasoning.between(first, shown)
        self._held = b""
        # Without stream_reasoning, SGLang sends the reasoning in one piece once it has closed.
        if reasoning and not self._options.stream_reasoning and finish is None and shown <= self._reasoning.stop:
            self._held, reasoning = reasoning, b""
        usage = self._continuous_usage(generated)
        if reasoning:
            events.append(self._choice(b'{"reasoning_content":"' + reasoning + b'"}', usage=usage))
        if content := self._content.between(first, shown):
            events.append(self._choice(b'{"reasoning_content":null,"content":"' + content + b'"}', usage=usage))
        if finish is not None:
            matched = finish.get("matched")
            events.append(
                self._choice(
                    b'{"reasoning_content":null}', finish_reason=dumps(finish["type"]), matched_stop=dumps(matched)
                )
            )
            if self._options.include_usage:
                usage = self._usage(generated, count_bias)
                events.append(self._head + b"]," + b'"usage":' + dumps(usage) + b"}\n\n")
        return b"".join(events)

    def streamed(self, generated: int) -> dict[str, Any]:
        """What the deltas of the first `generated` tokens carried (for the completion log): the
        reasoning and content, and `text`, the two joined. Reasoning still held back (without
        stream_reasoning) was not sent."""
        shown = min(generated, self._output_len)
        reasoning = self._reasoning.between(0, shown)
        if self._held:
            reasoning = reasoning[: len(reasoning) - len(self._held)]
        content = self._content.between(0, shown)
        reasoning_text, content_text = unescape(reasoning), unescape(content)
        return {"text": reasoning_text + content_text, "reasoning_content": reasoning_text, "content": content_text}

    @property
    def counts_in_stream(self) -> bool:
        """Only the usage chunk reports the final count (continuous usage stats do not miscount)."""
        return self._options.include_usage

    def error_chunk(self) -> bytes:
        return sse(dumps({"error": openai_error(CUDA_ERROR, err_type=INTERNAL_ERROR_TYPE, code=500)}))

    def _choice(
        self,
        delta: bytes,
        *,
        finish_reason: bytes = b"null",
        matched_stop: bytes = b"null",
        usage: bytes = b"",
    ) -> bytes:
        return b"".join(
            (
                self._head,
                b'{"index":0,"delta":',
                delta,
                b',"logprobs":null,"finish_reason":',
                finish_reason,
                b',"matched_stop":',
                matched_stop,
                b"}]",
                usage,
                b"}\n\n",
            )
        )

    def _continuous_usage(self, generated: int) -> bytes:
        """`continuous_usage_stats`: SGLang adds prompt and completion counts to each delta."""
        if not self._options.continuous_usage_stats:
            return b""
        prompt = self._options.prompt_tokens
        usage = {
            "prompt_tokens": prompt,
            "total_tokens": prompt + generated,
            "completion_tokens": generated,
            "prompt_tokens_details": self._prompt_tokens_details(),
            "reasoning_tokens": 0,
            "completion_tokens_details": None,
        }
        return b',"usage":' + dumps(usage)

    # -- non-streaming ------------------------------------------------------------------------

    def body(self, finish: dict[str, Any] | None = None, *, count_bias: int = 0, generated: int | None = None) -> bytes:
        """The non-streaming response: the whole plan, or (aborted) its first `generated` tokens."""
        finish = finish or self.plan.finish_reason
        plan, options = self.plan, self._options
        if generated is not None:  # an abort: the texts of what was decoded by then
            reasoning = unescape(self._reasoning.between(0, generated))
            content = unescape(self._content.between(0, generated))
        elif options.separate_reasoning:
            reasoning, content = plan.reasoning_text, plan.content_text
        else:
            reasoning, content = "", plan.text(skip_special_tokens=options.skip_special_tokens)
        message = {"role": "assistant", "content": content or None, "reasoning_content": reasoning or None,
                   "tool_calls": None}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish["type"],
                  "matched_stop": finish.get("matched")}
        return dumps(
            {
                "id": options.completion_id,
                "object": "chat.completion",
                "created": options.created,
                "model": options.model,
                "choices": [choice],
                "usage": self._usage(plan.completion_tokens if generated is None else generated, count_bias),
                # `build_endpoint_weight_version_metadata` (sglang 0.5.23 `utils/weight_versions.py`):
                # the final meta_info's weight_version and its per-token spans.
                "metadata": {"weight_version": options.weight_version,
                             "weight_versions": weight_versions(plan.completion_tokens if generated is None
                                                                else generated, options.weight_version)},
            }
        )

    def abort_response(self) -> tuple[int, bytes]:
        return 503, http_exception_body(QUEUE_FULL, 503)

    def error_response(self) -> tuple[int, bytes]:
        return 500, openai_error_body(CUDA_ERROR, err_type=INTERNAL_ERROR_TYPE, code=500)

    def _prompt_tokens_details(self) -> dict[str, int] | None:
        """`PromptTokensDetails(cached_tokens=...)` with --enable-cache-report (its multimodal
        fields dropped when None, `entrypoints/openai/protocol.py`), else None."""
        return {"cached_tokens": self.cached_tokens} if self._options.cache_report else None

    def _usage(self, generated: int, count_bias: int = 0) -> dict[str, Any]:
        prompt = self._options.prompt_tokens
        reasoning = self.plan.reasoning_tokens_after(generated)
        generated += count_bias  # the miscount fault
        return {
            "prompt_tokens": prompt,
            "total_tokens": prompt + generated,
            "completion_tokens": generated,
            "prompt_tokens_details": self._prompt_tokens_details(),
            "reasoning_tokens": reasoning,
            "completion_tokens_details": {"reasoning_tokens": reasoning} if reasoning else None,
        }
