"""Streams one generation from SGLang: native `/generate` (the default) or `/v1/chat/completions`
with server-side reasoning split. Streams go over `stream_http.py`'s kept connections; the short
requests (/server_info, /abort_request) over one httpx client. Every wire failure leaves as one of
the typed errors of `workers/errors.py` (mapped in `wire_errors.py`)."""
from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import httpx

from genfleet.workers.errors import DeadlineExceeded, ShutdownRequested, StreamCut, TransientError
from genfleet.workers.sglang.chat_stream import ChatStreamAssembler
from genfleet.workers.sglang.generate_stream import StreamAssembler
from genfleet.workers.sglang.server_info import ModelIdentity, ServerInfo
from genfleet.workers.sglang.sse import data_payloads
from genfleet.workers.sglang.stream_http import StreamConnections
from genfleet.workers.sglang.wire_errors import http_error, transport_errors

if TYPE_CHECKING:
    from genfleet.workers.sglang.stream_watch import StreamWatch

log = logging.getLogger(__name__)


@dataclass
class Generation:
    finish_reason: dict[str, Any]
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cached_tokens: int
    first_token_s: float | None
    duration_s: float
    e2e_latency: float | None = None
    # The request id sent as `rid` (SGLang's request id: its logs, /abort_request).
    rid: str | None = None
    # /generate: the raw text (special tokens kept) and ids, split by the worker.
    text: str = ""
    output_ids: list[int] | None = None
    # /v1/chat/completions: the server already split them.
    reasoning: str | None = None
    content: str | None = None
    # The loop guard's finding (`Loop.to_dict()`); with `abort` the stream was cut there.
    loop: dict[str, int] | None = None


class _Assembler(Protocol):
    chunks: int

    @property
    def finished(self) -> bool: ...

    def feed(self, chunk: dict[str, Any]) -> None: ...


class SglangClient:
    def __init__(self, *, max_connections: int, connect_timeout_s: float, stall_timeout_s: float) -> None:
        # httpx defaults (100 connections, 5 s timeouts) would starve 150 streams and kill a quiet
        # reasoning phase: size the pool above the in-flight cap, read timeout = stall timeout.
        self._timeout = httpx.Timeout(connect=connect_timeout_s, read=stall_timeout_s, write=30.0, pool=60.0)
        # One TLS context for every client below: building one reads the CA bundle (~50 ms).
        self._tls = httpx.create_ssl_context()
        # Short requests (/server_info, /abort_request) share one pool.
        self.http = httpx.Client(
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            timeout=self._timeout, verify=self._tls,
        )
        self.stall_timeout_s = stall_timeout_s
        self.servers = ServerInfo(self.http)
        self.streams = StreamConnections(connect_timeout_s=connect_timeout_s, stall_timeout_s=stall_timeout_s,
                                         tls=self._tls)

    def close(self) -> None:
        self.http.close()
        self.streams.close()

    def interrupt_streams(self) -> None:
        """Wake every thread blocked reading a stream (a long prefill, a silent server); each
        stream then ends with a transport error, which the caller reads as its shutdown."""
        self.streams.interrupt()

    def forget(self, upstream: str) -> None:
        """The host came back (its breaker closed): it may have restarted with other settings."""
        self.servers.forget(upstream)

    def model_name(self, upstream: str) -> str:
        return self.servers.model_name(upstream)

    def model_identity(self, upstream: str) -> ModelIdentity:
        """Name, revision and weight version as the upstream reports them, cached per upstream."""
        return self.servers.model_identity(upstream)

    def generate(self, upstream: str, body: dict[str, Any], *, deadline: float,
                 should_stop: Callable[[], bool] = lambda: False, watch: StreamWatch | None = None) -> Generation:
        """Native `/generate` streaming, cumulative or incremental as the server reports it; `watch`
        may cut it short (the loop guard), and the server is then asked to drop the request."""
        body = {"rid": new_rid(), **body}
        mode = self.servers.stream_mode(upstream)
        started = time.monotonic()
        assembler = StreamAssembler(incremental=mode.incremental)
        cut = (lambda: watch.ids_arrived(assembler.output_ids)) if watch is not None else None
        first_token_s = self._stream(upstream, "/generate", body, assembler, started, deadline, should_stop,
                                     has_tokens=lambda: bool(assembler.output_ids), cut=cut)
        if cut is not None and not assembler.finished:
            self.abort_request(upstream, body["rid"])
            assembler.finish_reason = {"type": "loop"}
        meta = assembler.meta
        return Generation(
            finish_reason=assembler.finish_reason or {},
            prompt_tokens=int(meta.get("prompt_tokens") or 0),
            completion_tokens=int(meta.get("completion_tokens") or 0),
            reasoning_tokens=int(meta.get("reasoning_tokens") or 0),
            cached_tokens=int(meta.get("cached_tokens") or 0),
            first_token_s=first_token_s, duration_s=time.monotonic() - started,
            e2e_latency=meta.get("e2e_latency"), text=assembler.text, output_ids=assembler.output_ids,
            rid=body["rid"], loop=_loop_of(watch),
        )

    def chat(self, upstream: str, body: dict[str, Any], *, deadline: float,
             should_stop: Callable[[], bool] = lambda: False, watch: StreamWatch | None = None) -> Generation:
        """`/v1/chat/completions` streaming; asks for usage in the last chunk. A stream the loop
        guard cut has no usage chunk: its counts are then unknown (0)."""
        started = time.monotonic()
        assembler = ChatStreamAssembler()
        body = {"rid": new_rid(), **body, "stream": True, "stream_options": {"include_usage": True}}
        cut = (lambda: watch.text_arrived(assembler.reasoning, assembler.content)) if watch is not None else None
        first_token_s = self._stream(upstream, "/v1/chat/completions", body, assembler, started, deadline,
                                     should_stop, has_tokens=lambda: assembler.has_tokens, cut=cut)
        if cut is not None and not assembler.finished:
            self.abort_request(upstream, body["rid"])
            assembler.finish_reason = {"type": "loop"}
        else:
            assembler.verify()
        usage = assembler.usage
        details = usage.get("completion_tokens_details") or {}
        prompt_details = usage.get("prompt_tokens_details") or {}
        return Generation(
            finish_reason=assembler.finish_reason or {},
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            reasoning_tokens=int(usage.get("reasoning_tokens") or details.get("reasoning_tokens") or 0),
            cached_tokens=int(prompt_details.get("cached_tokens") or 0),
            first_token_s=first_token_s, duration_s=time.monotonic() - started,
            reasoning=assembler.reasoning, content=assembler.content, rid=body["rid"], loop=_loop_of(watch),
        )

    def abort_request(self, upstream: str, rid: str) -> None:
        """Ask the server to drop a request whose stream we closed. SGLang 0.5.23 itself drops it at
        once when the stream's connection closes (`managers/tokenizer_manager.py` `generate_request`
        releases it on the cancelled generator, `_release_req_states_on_failure`; the 2 s
        `create_abort_task` of `entrypoints/http_server.py` is a fallback): measured on the real
        server, its running count was 0 within 1 s (tests/sglang_real/test_loop_guard.py). The
        explicit abort still frees the slot where something between us and the scheduler (a router,
        a proxy) keeps its own connection open. `POST /abort_request {"rid": ...}` (0.5.23
        `http_server.py::abort_request`, `AbortReq`)
        answers 200 for a finished or unknown rid too. Best effort: the disconnect frees it anyway."""
        try:
            response = self.http.post(f"{upstream}/abort_request", json={"rid": rid}, timeout=5.0)
            if response.status_code != 200:
                log.warning("%s/abort_request for %s answered %d", upstream, rid, response.status_code)
        except httpx.HTTPError as error:
            log.warning("%s/abort_request for %s failed: %s", upstream, rid, error)

    def _stream(self, upstream: str, path: str, body: dict[str, Any], assembler: _Assembler, started: float,
                deadline: float, should_stop: Callable[[], bool], has_tokens: Callable[[], bool],
                cut: Callable[[], bool] | None = None) -> float | None:
        """Feeds every `data:` chunk to the assembler; returns the time to the first token. `cut`
        is asked after each chunk; True ends the stream there (closing the connection), unfinished."""
        first_token_s = None
        url = upstream + path
        with (transport_errors(url, self.stall_timeout_s, should_stop),
              self.streams.post(upstream, path, body) as response):
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
                assembler.feed(_decode_chunk(data))
                if first_token_s is None and has_tokens():
                    first_token_s = time.monotonic() - started
                if cut is not None and cut() and not assembler.finished:
                    return first_token_s
        if not assembler.finished:
            if should_stop():
                raise ShutdownRequested()  # the shutdown cut it: the message goes back, not a failure
            raise StreamCut(f"stream from {url} ended after {assembler.chunks} chunks without a finish reason")
        return first_token_s


def _loop_of(watch: StreamWatch | None) -> dict[str, int] | None:
    return watch.loop.to_dict() if watch is not None and watch.loop is not None else None


def new_rid() -> str:
    """SGLang's own default is uuid4().hex (io_struct.py); ours is the same shape, made here so the
    worker knows it (logs, and `/abort_request` to free a slot)."""
    return uuid.uuid4().hex


def _decode_chunk(data: bytes) -> dict[str, Any]:
    try:
        chunk = json.loads(data)
    except ValueError:
        raise TransientError(f"malformed stream chunk: {data[:200]!r}") from None
    if not isinstance(chunk, dict):
        raise TransientError(f"unexpected stream chunk: {data[:200]!r}")
    return chunk
