"""Streams one generation from SGLang over a shared httpx client: native `/generate` (the default)
or `/v1/chat/completions` with server-side reasoning split. Every wire failure leaves as one of
the typed errors of `workers/errors.py` (mapped in `wire_errors.py`)."""
from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from workers.errors import DeadlineExceeded, ShutdownRequested, StreamCut, TransientError
from workers.sglang.chat_stream import ChatStreamAssembler
from workers.sglang.generate_stream import StreamAssembler
from workers.sglang.server_info import ServerInfo
from workers.sglang.wire_errors import http_error, transport_errors


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


class _Assembler(Protocol):
    chunks: int

    @property
    def finished(self) -> bool: ...

    def feed(self, chunk: dict[str, Any]) -> None: ...


class SglangClient:
    def __init__(self, *, max_connections: int, connect_timeout_s: float, stall_timeout_s: float) -> None:
        # httpx defaults (100 connections, 5 s timeouts) would starve 150 streams and kill a quiet
        # reasoning phase: size the pool above the in-flight cap, read timeout = stall timeout.
        self.http = httpx.Client(
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            timeout=httpx.Timeout(connect=connect_timeout_s, read=stall_timeout_s, write=30.0, pool=60.0),
        )
        self.stall_timeout_s = stall_timeout_s
        self.servers = ServerInfo(self.http)
        self._sockets: set[socket.socket] = set()  # of the streams being read now
        self._sockets_lock = threading.Lock()

    def close(self) -> None:
        self.http.close()

    def interrupt_streams(self) -> None:
        """Wake every thread blocked reading a stream (a long prefill, a silent server): shutdown
        makes a blocked recv() return at once, where close() from another thread may not. Each
        stream then ends with a transport error, which the caller reads as its shutdown."""
        with self._sockets_lock:
            sockets = list(self._sockets)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed

    def forget(self, upstream: str) -> None:
        """The host came back (its breaker closed): it may have restarted with other settings."""
        self.servers.forget(upstream)

    def model_name(self, upstream: str) -> str:
        return self.servers.model_name(upstream)

    def generate(self, upstream: str, body: dict[str, Any], *, deadline: float,
                 should_stop: Callable[[], bool] = lambda: False) -> Generation:
        """Native `/generate` streaming, cumulative or incremental as the server reports it."""
        body = {"rid": new_rid(), **body}
        mode = self.servers.stream_mode(upstream)
        started = time.monotonic()
        assembler = StreamAssembler(incremental=mode.incremental)
        first_token_s = self._stream(f"{upstream}/generate", body, assembler, started, deadline, should_stop,
                                     has_tokens=lambda: bool(assembler.output_ids))
        meta = assembler.meta
        return Generation(
            finish_reason=assembler.finish_reason or {},
            prompt_tokens=int(meta.get("prompt_tokens") or 0),
            completion_tokens=int(meta.get("completion_tokens") or 0),
            reasoning_tokens=int(meta.get("reasoning_tokens") or 0),
            cached_tokens=int(meta.get("cached_tokens") or 0),
            first_token_s=first_token_s, duration_s=time.monotonic() - started,
            e2e_latency=meta.get("e2e_latency"), text=assembler.text, output_ids=assembler.output_ids,
            rid=body["rid"],
        )

    def chat(self, upstream: str, body: dict[str, Any], *, deadline: float,
             should_stop: Callable[[], bool] = lambda: False) -> Generation:
        """`/v1/chat/completions` streaming; asks for usage in the last chunk."""
        started = time.monotonic()
        assembler = ChatStreamAssembler()
        body = {"rid": new_rid(), **body, "stream": True, "stream_options": {"include_usage": True}}
        first_token_s = self._stream(f"{upstream}/v1/chat/completions", body, assembler, started, deadline,
                                     should_stop, has_tokens=lambda: assembler.has_tokens)
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
            reasoning=assembler.reasoning, content=assembler.content, rid=body["rid"],
        )

    def _stream(self, url: str, body: dict[str, Any], assembler: _Assembler, started: float,
                deadline: float, should_stop: Callable[[], bool], has_tokens: Callable[[], bool]) -> float | None:
        """Feeds every `data:` chunk to the assembler; returns the time to the first token."""
        first_token_s = None
        with (transport_errors(url, self.stall_timeout_s, should_stop),
              self.http.stream("POST", url, json=body) as response, self._tracked(response)):
            if response.status_code != 200:
                raise http_error(response)
            for line in response.iter_lines():
                if should_stop():
                    raise ShutdownRequested()
                if time.monotonic() > deadline:
                    raise DeadlineExceeded("generation ran past the task deadline")
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                assembler.feed(_decode_chunk(data))
                if first_token_s is None and has_tokens():
                    first_token_s = time.monotonic() - started
        if not assembler.finished:
            if should_stop():
                raise ShutdownRequested()  # the shutdown cut it: the message goes back, not a failure
            raise StreamCut(f"stream from {url} ended after {assembler.chunks} chunks without a finish reason")
        return first_token_s


    @contextmanager
    def _tracked(self, response: httpx.Response) -> Iterator[None]:
        stream = response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is None:  # another transport (tests' mocks): nothing to interrupt
            yield
            return
        with self._sockets_lock:
            self._sockets.add(sock)
        try:
            yield
        finally:
            with self._sockets_lock:
                self._sockets.discard(sock)


def new_rid() -> str:
    """SGLang's own default is uuid4().hex (io_struct.py); ours is the same shape, made here so the
    worker knows it (logs, and `/abort_request` to free a slot)."""
    return uuid.uuid4().hex


def _decode_chunk(data: str) -> dict[str, Any]:
    try:
        chunk = json.loads(data)
    except ValueError:
        raise TransientError(f"malformed stream chunk: {data[:200]!r}") from None
    if not isinstance(chunk, dict):
        raise TransientError(f"unexpected stream chunk: {data[:200]!r}")
    return chunk
