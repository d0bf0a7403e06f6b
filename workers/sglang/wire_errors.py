"""Every way SGLang says no, mapped once into genfleet's typed errors (`workers/errors.py`), the way
httpx maps its transport's exceptions at one boundary (`httpx/_transports/default.py`).

Shapes, from sglang 0.5.23 (`entrypoints/http_server.py`, `managers/tokenizer_manager.py`):
an HTTP status before the stream; `data: {"error": {...}}` mid-stream (0.5.23 sends message, type,
code, retryable; 0.5.2 only message); a final chunk whose `finish_reason.type` is "abort".
"""
from __future__ import annotations

import http.client
import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from genfleet.workers.errors import PermanentError, ShutdownRequested, StreamStalled, TransientError, UpstreamAborted
from genfleet.workers.sglang.stream_http import SendFailed

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
    """The transport's exceptions while talking to `url` (`stream_http.py`: socket and TLS errors,
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
