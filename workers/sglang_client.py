"""Streams one generation from SGLang over a shared httpx client: native `/generate` (the default)
or `/v1/chat/completions` with server-side reasoning split."""
from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import httpx

from workers.chat_stream import ChatStreamAssembler
from workers.errors import (
    DeadlineExceeded, PermanentError, ShutdownRequested, StreamCut, StreamStalled, TransientError,
)
from workers.sglang_stream import UNKNOWN, StreamAssembler, StreamMode

# 408 and 429 are "try later"; every other 4xx means the request itself is wrong.
RETRYABLE_4XX = {408, 429}


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
        self._model_names: dict[str, str] = {}
        self._stream_modes: dict[str, StreamMode] = {}
        self._asking = threading.Lock()  # 150 threads starting at once ask /server_info once

    def close(self) -> None:
        self.http.close()

    def forget(self, upstream: str) -> None:
        """The host came back (its breaker closed): it may have restarted with other settings."""
        self._model_names.pop(upstream, None)
        self._stream_modes.pop(upstream, None)

    def stream_mode(self, upstream: str) -> StreamMode:
        """Cumulative or incremental chunks, as the server's `/server_info` says, asked once per
        upstream; UNKNOWN (infer from the chunks) where neither it nor `/get_server_info` answers."""
        mode = self._stream_modes.get(upstream)
        if mode is not None:
            return mode
        with self._asking:
            mode = self._stream_modes.get(upstream)
            if mode is None:
                mode = self._ask_stream_mode(upstream)
                if mode is not None:
                    self._stream_modes[upstream] = mode
        return mode or UNKNOWN

    def _ask_stream_mode(self, upstream: str) -> StreamMode | None:
        """None: could not ask now (asked again next time); UNKNOWN: the server has no such page."""
        # /get_server_info is the older name, still an alias in 0.5.23 (entrypoints/http_server.py).
        for path in ("/server_info", "/get_server_info"):
            try:
                response = self.http.get(f"{upstream}{path}", timeout=10.0)
            except httpx.HTTPError:
                return None
            if response.status_code in (404, 405):
                continue
            if response.status_code != 200:
                return None
            try:
                return StreamMode.from_server_info(response.json())
            except ValueError:
                continue
        return UNKNOWN

    def model_name(self, upstream: str) -> str:
        """The served model's name from `/model_info`, asked once per upstream."""
        name = self._model_names.get(upstream)
        if name is None:
            try:
                info = self.http.get(f"{upstream}/model_info", timeout=5.0).json()
            except (httpx.HTTPError, ValueError):
                return "unknown"  # not cached: asked again with the next record
            name = str(info.get("served_model_name") or info.get("model_path") or "unknown")
            self._model_names[upstream] = name
        return name

    def generate(self, upstream: str, body: dict[str, Any], *, deadline: float,
                 should_stop: Callable[[], bool] = lambda: False) -> Generation:
        """Native `/generate` streaming, cumulative or incremental as the server reports it."""
        body = {"rid": new_rid(), **body}
        mode = self.stream_mode(upstream)
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
        try:
            with self.http.stream("POST", url, json=body) as response:
                if response.status_code != 200:
                    raise _http_error(response)
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
        except httpx.ReadTimeout:
            raise StreamStalled(f"no data from {url} for {self.stall_timeout_s:g} s") from None
        except httpx.TimeoutException as error:
            raise TransientError(f"timeout talking to {url}: {type(error).__name__}") from None
        except httpx.TransportError as error:
            raise TransientError(f"transport error from {url}: {type(error).__name__}: {error}") from None
        if not assembler.finished:
            raise StreamCut(f"stream from {url} ended after {assembler.chunks} chunks without a finish reason")
        return first_token_s


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


def _http_error(response: httpx.Response) -> TransientError | PermanentError:
    response.read()
    detail = _error_message(response)
    message = f"HTTP {response.status_code} from {response.request.url}: {detail}"
    if response.status_code >= 500 or response.status_code in RETRYABLE_4XX:
        return TransientError(message)
    return PermanentError(message)


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    error = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(error, dict):
        return str(error.get("message", error))
    return str(error)
