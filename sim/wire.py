"""SGLang 0.5.23 `/generate` bytes: response objects, SSE framing and error bodies.

Streams are built from byte slices, not `json.dumps` per chunk: a completion's escaped text and
its id list are joined once, and every chunk (cumulative or delta) is a slice of them. SGLang's
default cumulative stream is quadratic in bytes, and the simulator must not be the bottleneck.
"""
from __future__ import annotations

import json
import time
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
        self.cached_tokens = 0  # set by the engine at the prefill (sim.prefix_cache)
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
        parts = [
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
