"""Every way SGLang says no, mapped once into genfleet's typed errors (`workers/errors.py`), the way
httpx maps its transport's exceptions at one boundary (`httpx/_transports/default.py`).

Shapes, from sglang 0.5.23 (`entrypoints/http_server.py`, `managers/tokenizer_manager.py`):
an HTTP status before the stream; `data: {"error": {...}}` mid-stream (0.5.23 sends message, type,
code, retryable; 0.5.2 only message); a final chunk whose `finish_reason.type` is "abort".
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from workers.errors import PermanentError, ShutdownRequested, StreamStalled, TransientError, UpstreamAborted

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


def abort_error(finish_reason: dict[str, Any]) -> TransientError | PermanentError:
    message = finish_reason.get("message") or "aborted"
    status = finish_reason.get("status_code")
    if isinstance(status, int) and 400 <= status < 500 and status not in RETRYABLE_4XX:
        return PermanentError(f"upstream aborted ({status}): {message}")
    return UpstreamAborted(f"upstream aborted ({status}): {message}")


def http_error(response: httpx.Response) -> TransientError | PermanentError:
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


@contextmanager
def transport_errors(url: str, stall_timeout_s: float,
                     should_stop: Callable[[], bool] = lambda: False) -> Iterator[None]:
    """httpx's exceptions while talking to `url`, as transient errors that name it; as
    ShutdownRequested when the worker is stopping (its shutdown cut the stream on purpose)."""
    try:
        yield
    except httpx.TransportError as error:
        if should_stop():
            raise ShutdownRequested() from None
        if isinstance(error, httpx.ReadTimeout):
            raise StreamStalled(f"no data from {url} for {stall_timeout_s:g} s") from None
        if isinstance(error, httpx.TimeoutException):
            raise TransientError(f"timeout talking to {url}: {type(error).__name__}") from None
        raise TransientError(f"transport error from {url}: {type(error).__name__}: {error}") from None
