"""The simulator's bytes on the wire: `/generate` responses and SSE framing, and OpenAI chat frames.

SGLang 0.5.23 `/generate` bytes: response objects, SSE framing and error bodies.

Streams are built from byte slices, not `json.dumps` per chunk: a completion's escaped text and
its id list are joined once, and every chunk (cumulative or delta) is a slice of them. SGLang's
default cumulative stream is quadratic in bytes, and the simulator must not be the bottleneck.

SGLang 0.5.23 `/v1/chat/completions` bytes: chunks, the non-streaming response, error bodies.

The server splits reasoning from content itself. The plan knows which output ids are reasoning
words, content words and markers, so each delta is the exact text a perfect parser recovers:
`reasoning_content` deltas concatenate to the plan's reasoning, `content` deltas to its content.
Like `/generate`'s, chunks are byte slices of texts escaped once per request.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from genfleet.sim.completion import CompletionPlan
from genfleet.sim.faults import ErrorFormat
from genfleet.sim.vocab import SimVocab

DONE = b"data: [DONE]\n\n"
DEFAULT_WEIGHT_VERSION = "default"  # SGLang's --weight-version default
SSE_MEDIA_TYPE = "text/event-stream"

CUDA_ERROR = "CUDA error: an illegal memory access was encountered"
QUEUE_FULL = "The request queue is full."


def dumps(obj: Any) -> bytes:
    """Compact JSON, UTF-8 unescaped, like SGLang's orjson."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def sse(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


class ChunkEncoder:
    """Per-vocabulary tables of each id's JSON-escaped text and decimal form."""

    def __init__(self, vocab: SimVocab) -> None:
        escaped = [dumps(piece)[1:-1] for piece in vocab.pieces]
        self._text_kept = tuple(escaped)
        self._text_skipped = tuple(
            b"" if token_id in vocab.special_ids else piece for token_id, piece in enumerate(escaped)
        )
        self._ids = tuple(str(token_id).encode() for token_id in range(len(vocab.pieces)))

    def text_table(self, *, skip_special_tokens: bool) -> tuple[bytes, ...]:
        """Each id's text, JSON-escaped without quotes (empty for special ids when skipped)."""
        return self._text_skipped if skip_special_tokens else self._text_kept

    def frames(
        self,
        plan: CompletionPlan,
        *,
        rid: str,
        prompt_tokens: int,
        skip_special_tokens: bool,
        incremental: bool,
        error_format: ErrorFormat = ErrorFormat.V0_5_23,
        weight_version: str = DEFAULT_WEIGHT_VERSION,
    ) -> CompletionFrames:
        table = self.text_table(skip_special_tokens=skip_special_tokens)
        ids, text_end = plan.output_ids, plan.text_end
        return CompletionFrames(
            plan,
            # A matched stop token is sent as an id but has no text: the detokenizer trims it
            # (sglang 0.5.23 `managers/detokenizer_manager.py` `trim_matched_stop`).
            text_pieces=[table[token_id] for token_id in ids[:text_end]] + [b""] * (len(ids) - text_end),
            id_pieces=[self._ids[token_id] for token_id in plan.output_ids],
            rid=rid,
            prompt_tokens=prompt_tokens,
            incremental=incremental,
            error_format=error_format,
            weight_version=weight_version,
        )


class CompletionFrames:
    """The response objects of one request, at any number of generated tokens."""

    def __init__(
        self,
        plan: CompletionPlan,
        *,
        text_pieces: list[bytes],
        id_pieces: list[bytes],
        rid: str,
        prompt_tokens: int,
        incremental: bool,
        error_format: ErrorFormat = ErrorFormat.V0_5_23,
        weight_version: str = DEFAULT_WEIGHT_VERSION,
    ) -> None:
        self.plan = plan
        self._weight_version = weight_version
        self._error_format = error_format
        # Memoryviews, so that a chunk's prefix is copied once, by the join that builds it.
        self._text = memoryview(b"".join(text_pieces))
        self._text_ends = [0, *accumulate(map(len, text_pieces))]
        self._ids = memoryview(b",".join(id_pieces))
        # End of the k-th id in `_ids`: the lengths so far plus the k - 1 commas between them.
        self._id_ends = [0, *(end + k for k, end in enumerate(accumulate(map(len, id_pieces))))]
        self._incremental = incremental
        self._output_len = len(plan.output_ids)
        self._shown = 0  # output ids already sent, for delta chunks
        self.cached_tokens = 0  # set by the engine at the prefill (sim.capacity)
        self._started_streaming = False  # the first chunk carries response_sent_to_client_ts
        self._started = time.monotonic()
        self._meta_head = b'],"meta_info":{"id":' + dumps(rid) + b',"finish_reason":'
        self._meta_body = (b',"prompt_tokens":%d,"weight_version":' % prompt_tokens + dumps(weight_version)
                           + b',"num_retractions":0')

    def chunk(self, generated: int, *, finish: dict[str, Any] | None = None, count_bias: int = 0) -> bytes:
        """The SSE event after `generated` tokens; `finish` marks the last one. `count_bias` is
        added to the completion_tokens it reports (the miscount fault)."""
        return self._response(generated, finish, b'data: {"text":"', b"}}\n\n", count_bias)

    def body(self, finish: dict[str, Any] | None = None, *, count_bias: int = 0, generated: int | None = None) -> bytes:
        """The non-streaming response: everything (or, aborted, the first `generated` tokens), first
        and last at once."""
        generated = self.plan.completion_tokens if generated is None else generated
        return self._response(generated, finish or self.plan.finish_reason, b'{"text":"', b"}}", count_bias)

    def streamed(self, generated: int) -> dict[str, Any]:
        """The text of the first `generated` tokens, as the chunks carry it (for the completion log)."""
        shown = min(generated, self._output_len)
        return {"text": unescape(self._text[: self._text_ends[shown]])}

    counts_in_stream = True  # every chunk's meta_info has completion_tokens

    def error_chunk(self) -> bytes:
        """An internal error striking mid-stream."""
        return internal_error_chunk(self._error_format)

    def abort_response(self) -> tuple[int, bytes]:
        """A scheduler abort of a non-streaming request."""
        return 503, http_exception_body(QUEUE_FULL, 503)

    def error_response(self) -> tuple[int, bytes]:
        """An internal error of a non-streaming request."""
        return 500, message_error_body(CUDA_ERROR)

    def _response(
        self, generated: int, finish: dict[str, Any] | None, head: bytes, tail: bytes, count_bias: int = 0
    ) -> bytes:
        shown = min(generated, self._output_len)
        start = self._shown if self._incremental else 0
        first = not self._started_streaming
        self._shown, self._started_streaming = shown, True
        parts: list[bytes | memoryview] = [
            head,
            self._text[self._text_ends[start] : self._text_ends[shown]],
            b'","output_ids":[',
            self._ids[self._id_ends[start] + 1 if start else 0 : self._id_ends[shown]],
            self._meta_head,
            b"null" if finish is None else dumps(finish),
            self._meta_body,
            b',"reasoning_tokens":%d,"completion_tokens":%d,"cached_tokens":%d'
            % (self.plan.reasoning_tokens_after(generated), generated + count_bias, self.cached_tokens),
        ]
        if finish is not None:
            parts.append(weight_versions_field(shown, self._weight_version))
        parts += [_cached_tokens_details(self.cached_tokens), b',"dp_rank":null']
        if finish is not None:
            parts.append(b',"e2e_latency":' + repr(time.monotonic() - self._started).encode())
        if first:
            parts.append(b',"response_sent_to_client_ts":' + repr(time.time()).encode())
        parts.append(tail)
        return b"".join(parts)


def weight_versions(tokens: int, version: str = DEFAULT_WEIGHT_VERSION) -> list[dict[str, Any]]:
    """Which weights made which output tokens: one span, the launch's --weight-version, for all of
    them (sglang 0.5.23 `utils/weight_versions.py` `compute_weight_version_spans`; a server whose
    weights never change has no other events)."""
    return [{"version": version, "start": 0, "end": tokens}]


def weight_versions_field(tokens: int, version: str = DEFAULT_WEIGHT_VERSION) -> bytes:
    """meta_info's `weight_versions`, on the final chunk only (`output_streamer.py` appends it
    when `req.finished()`, None before; `tokenizer_manager.py` copies it in when set): after
    `cached_tokens`, before `cached_tokens_details`, as 0.5.23 orders them."""
    return b',"weight_versions":' + dumps(weight_versions(tokens, version))


def _cached_tokens_details(cached: int) -> bytes:
    """meta_info's cache breakdown: null without a hit, else all of it on the GPU (sglang 0.5.23
    `output_streamer.py` `get_cached_tokens_details`, copied in by `tokenizer_manager.py`
    `_handle_batch_output`)."""
    if not cached:
        return b',"cached_tokens_details":null'
    return b',"cached_tokens_details":{"device":%d,"host":0}' % cached


def unescape(escaped: bytes | memoryview) -> str:
    """The text of JSON-escaped bytes (once per request, never per chunk)."""
    return json.loads(b'"' + bytes(escaped) + b'"')


# -- errors ------------------------------------------------------------------------------------


def abort_finish(message: str = QUEUE_FULL, status_code: int = 503) -> dict[str, Any]:
    """A scheduler abort is a normal last chunk whose finish_reason says so, not an error object."""
    return {"type": "abort", "message": message, "status_code": status_code, "err_type": None}


def error_chunk(message: str, *, err_type: str, code: int, retryable: bool, fmt: ErrorFormat) -> bytes:
    if fmt is ErrorFormat.V0_5_2:
        return sse(dumps({"error": {"message": message}}))
    return sse(dumps({"error": {"message": message, "type": err_type, "code": code, "retryable": retryable}}))


def invalid_request_chunk(message: str, fmt: ErrorFormat) -> bytes:
    """What a ValueError raised after the stream's headers went out becomes (still HTTP 200)."""
    return error_chunk(message, err_type="invalid_request_error", code=400, retryable=False, fmt=fmt)


def internal_error_chunk(fmt: ErrorFormat) -> bytes:
    return error_chunk(CUDA_ERROR, err_type="internal_error", code=500, retryable=True, fmt=fmt)


def message_error_body(message: str) -> bytes:
    """`_create_error_response`: non-stream ValueErrors and server errors."""
    return dumps({"error": {"message": message}})


def http_exception_body(message: str, status_code: int) -> bytes:
    """The custom HTTPException handler, used for non-stream scheduler aborts."""
    return dumps({"object": "error", "message": message, "type": str(status_code), "param": None, "code": status_code})


def schema_error_body(message: str) -> bytes:
    """0.5.23's schema gate answers a plain string, serde-worded."""
    return dumps({"error": message})


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
        self.cached_tokens = 0  # set by the engine at the prefill (sim.capacity)
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
                totals = self._usage(generated, count_bias)
                events.append(self._head + b"]," + b'"usage":' + dumps(totals) + b"}\n\n")
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
