"""What every server kind shares on the wire: its two ways to a host (`Connections`: kept
connections for the streams, an httpx client for the short requests, `/health`), reading a
`text/event-stream` of JSON chunks into a kind's assembler, the transport's and HTTP's ways of
failing mapped once into genfleet's typed errors (`workers/errors.py`), and the OpenAI chat stream,
which SGLang and vLLM both serve. A kind's own wire (bodies, native streams, pages) stays in its
module.
"""
from __future__ import annotations

import http.client
import json
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from genfleet.workers.errors import (
    DeadlineExceeded,
    IntegrityError,
    PermanentError,
    SendFailed,
    ShutdownRequested,
    StreamCut,
    StreamStalled,
    TransientError,
    UpstreamAborted,
)
from genfleet.workers.generation.loop_guard import StreamWatch
from genfleet.workers.servers.api import Health
from genfleet.workers.servers.transport import StreamConnections, data_payloads

# Both kinds answer it: 200 once the server can generate (SGLang 0.5.23 answers 503 before its
# warm-up; vLLM 0.32.0 `entrypoints/serve/instrumentator/health.py`).
HEALTH_PATH = "/health"


@dataclass
class Connections:
    """A server kind's two ways to its hosts, sized above the in-flight cap: `streams`
    (`transport.py`'s kept HTTP/1.1 connections) and `http` (httpx, for the pages, health and
    abort requests). httpx's defaults (100 connections, 5 s timeouts) would starve 150 streams and
    kill a quiet reasoning phase: the read timeout is the stall timeout."""

    http: httpx.Client
    streams: StreamConnections
    stall_timeout_s: float

    @classmethod
    def open(cls, *, max_connections: int, connect_timeout_s: float, stall_timeout_s: float) -> Connections:
        timeout = httpx.Timeout(connect=connect_timeout_s, read=stall_timeout_s, write=30.0, pool=60.0)
        # One TLS context for both: building one reads the CA bundle (~50 ms).
        tls = httpx.create_ssl_context()
        http = httpx.Client(
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            timeout=timeout, verify=tls,
        )
        streams = StreamConnections(connect_timeout_s=connect_timeout_s, stall_timeout_s=stall_timeout_s, tls=tls)
        return cls(http, streams, stall_timeout_s)

    def close(self) -> None:
        self.http.close()
        self.streams.close()

    def health(self, upstream: str, timeout_s: float) -> Health:
        try:
            response = self.http.get(f"{upstream}{HEALTH_PATH}", timeout=timeout_s)
        except httpx.HTTPError as error:
            return Health(ready=False, reachable=False, detail=f"unreachable: {str(error) or type(error).__name__}")
        if response.status_code != 200:
            return Health(ready=False, reachable=True, detail=f"GET {HEALTH_PATH} answered {response.status_code}")
        return Health(ready=True, reachable=True)

# 408 and 429 are "try later"; every other 4xx means the request itself is wrong.
RETRYABLE_4XX = {408, 429}

# What SGLang reports as a bad request (a ValueError in the server): the same request fails again.
INVALID_REQUEST = re.compile(
    r"context length|maximum context|Either text, input_ids|Duplicate request ID|unknown field|"
    r"invalid|expected one of|not supported", re.I)


def error_from_chunk(error: Any) -> TransientError | PermanentError:
    """`data: {"error": ...}`: 0.5.23 says {message,type,code,retryable}; 0.5.2 only {message}."""
    if not isinstance(error, dict):
        error = {"message": str(error)}
    message = str(error.get("message", error))
    retryable = error.get("retryable")
    code = error.get("code")
    if retryable is None and isinstance(code, int):
        retryable = code >= 500 or code in RETRYABLE_4XX
    if retryable is None:
        retryable = not INVALID_REQUEST.search(message)
    return (TransientError if retryable else PermanentError)(f"upstream error: {message}")


def http_error(status: int, url: str, body: bytes) -> TransientError | PermanentError:
    """A refused request (any status but 200, before the stream), by its status and body."""
    message = f"HTTP {status} from {url}: {_error_message(body)}"
    if status >= 500 or status in RETRYABLE_4XX:
        return TransientError(message)
    return PermanentError(message)


def _error_message(body: bytes) -> str:
    try:
        parsed = json.loads(body)
    except ValueError:
        return body[:500].decode("utf-8", "replace")
    error = parsed.get("error", parsed) if isinstance(parsed, dict) else parsed
    if isinstance(error, dict):
        return str(error.get("message", error))
    return str(error)


@contextmanager
def transport_errors(url: str, stall_timeout_s: float,
                     should_stop: Callable[[], bool] = lambda: False) -> Iterator[None]:
    """The transport's exceptions while talking to `url` (`transport.py`: socket and TLS errors,
    `http.client`'s protocol errors), as transient errors that name it; as ShutdownRequested when
    the worker is stopping (its shutdown cut the stream on purpose). A timeout once the request
    is out is the stall timeout (the socket's read timeout); one before it, the connect timeout."""
    try:
        yield
    except SendFailed as failed:
        if should_stop():
            raise ShutdownRequested() from None
        error = failed.cause
        if isinstance(error, TimeoutError):
            raise TransientError(f"timeout talking to {url}: could not connect and send") from None
        raise TransientError(f"transport error from {url}: {type(error).__name__}: {error}") from None
    except (OSError, http.client.HTTPException) as error:
        if should_stop():
            raise ShutdownRequested() from None
        if isinstance(error, TimeoutError):
            raise StreamStalled(f"no data from {url} for {stall_timeout_s:g} s") from None
        raise TransientError(f"transport error from {url}: {type(error).__name__}: {error}") from None

class HttpServerKind:
    """What every server kind's class starts from: its `Connections` (the streams, the short
    requests), closing them, waking the threads blocked on a stream, and `/health`."""

    def __init__(self, *, max_connections: int, connect_timeout_s: float, stall_timeout_s: float) -> None:
        self.connections = Connections.open(max_connections=max_connections, connect_timeout_s=connect_timeout_s,
                                            stall_timeout_s=stall_timeout_s)
        self.http, self.streams = self.connections.http, self.connections.streams
        self.stall_timeout_s = stall_timeout_s

    def close(self) -> None:
        self.connections.close()

    def interrupt_streams(self) -> None:
        """Wake every thread blocked reading a stream (a long prefill, a silent server); each
        stream then ends with a transport error, which the caller reads as its shutdown."""
        self.streams.interrupt()

    def health(self, upstream: str, timeout_s: float) -> Health:
        return self.connections.health(upstream, timeout_s)


# OpenAI finish reasons, mapped to SGLang's native finish types used in records.
FINISH_TYPES = {"stop": "stop", "tool_calls": "stop", "function_call": "stop", "length": "length",
                "abort": "abort", "content_filter": "abort"}


@dataclass
class ChatStreamAssembler:
    reasoning: str = ""
    content: str = ""
    usage: dict[str, Any] = field(default_factory=dict)
    finish_reason: dict[str, Any] | None = None
    chunks: int = 0
    # Chunks that carried text: SGLang sends none without at least one new token.
    text_chunks: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def has_tokens(self) -> bool:
        return bool(self.reasoning or self.content)

    def feed(self, chunk: dict[str, Any]) -> None:
        if "error" in chunk:
            raise error_from_chunk(chunk["error"])
        self.chunks += 1
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            # SGLang 0.5.23 names it `reasoning_content`; vLLM 0.32.0 `reasoning`
            # (`entrypoints/openai/chat_completion/protocol.py` `DeltaMessage`).
            reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
            content = delta.get("content") or ""
            self.reasoning += reasoning
            self.content += content
            self.text_chunks += bool(reasoning or content)
            reason = choice.get("finish_reason")
            if reason is not None:
                self.finish_reason = {"type": FINISH_TYPES.get(reason, reason), "matched": choice.get("matched_stop")}
                if self.finish_reason["type"] == "abort":
                    raise UpstreamAborted(f"upstream aborted the chat stream ({reason})")

    def verify(self) -> None:
        """What the chat stream lets us check, which is less than `/generate`: deltas carry text, not
        ids, and SGLang may split one step's text over a reasoning and a content chunk
        (0.5.23 `entrypoints/openai/serving_chat.py::_generate_stream_content`), so chunks do not
        count tokens. The usage chunk asked for with `stream_options.include_usage` must arrive
        (without it the record's counts would be zeros), and a stream that carried text cannot
        have generated zero tokens."""
        if not self.usage:
            raise IntegrityError("stream integrity: the chat stream ended without the usage chunk that "
                                 "stream_options.include_usage asks for")
        completion_tokens = self.usage.get("completion_tokens")
        if not isinstance(completion_tokens, int) or (self.text_chunks and completion_tokens < 1):
            raise IntegrityError(f"stream integrity: usage says {completion_tokens!r} completion tokens but "
                                 f"{self.text_chunks} chunks carried text")


class Assembler(Protocol):
    """A server kind's stream reader: fed each decoded `data:` chunk, finished at the final one."""

    chunks: int

    @property
    def finished(self) -> bool: ...

    def feed(self, chunk: dict[str, Any]) -> None: ...



def read_stream(streams: StreamConnections, stall_timeout_s: float, upstream: str, path: str, body: dict[str, Any],
                assembler: Assembler, started: float, deadline: float, should_stop: Callable[[], bool],
                has_tokens: Callable[[], bool], cut: Callable[[], bool] | None = None) -> float | None:
    """Feeds every `data:` chunk to the assembler; returns the time to the first token. `cut`
    is asked after each chunk; True ends the stream there (closing the connection), unfinished."""
    first_token_s = None
    url = upstream + path
    with (transport_errors(url, stall_timeout_s, should_stop),
          streams.post(upstream, path, body) as response):
        if response.status != 200:
            raise http_error(response.status, url, response.error_body())
        for data in data_payloads(response.blocks(lambda: assembler.finished)):
            if should_stop():
                raise ShutdownRequested()
            if time.monotonic() > deadline:
                raise DeadlineExceeded("generation ran past the task deadline")
            if data == b"[DONE]":
                # Read on to the body's end rather than break: only a response read to its
                # end leaves its connection fit for the next stream.
                continue
            assembler.feed(decode_chunk(data))
            if first_token_s is None and has_tokens():
                first_token_s = time.monotonic() - started
            if cut is not None and cut() and not assembler.finished:
                return first_token_s
    if not assembler.finished:
        if should_stop():
            raise ShutdownRequested()  # the shutdown cut it: the message goes back, not a failure
        raise StreamCut(f"stream from {url} ended after {assembler.chunks} chunks without a finish reason")
    return first_token_s



def loop_of(watch: StreamWatch | None) -> dict[str, int] | None:
    return watch.loop.to_dict() if watch is not None and watch.loop is not None else None


def decode_chunk(data: bytes) -> dict[str, Any]:
    try:
        chunk = json.loads(data)
    except ValueError:
        raise TransientError(f"malformed stream chunk: {data[:200]!r}") from None
    if not isinstance(chunk, dict):
        raise TransientError(f"unexpected stream chunk: {data[:200]!r}")
    return chunk
