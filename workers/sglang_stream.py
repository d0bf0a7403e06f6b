"""Assembles SGLang `/generate` stream chunks into one generation, whatever the server's mode.

SGLang streams cumulative chunks by default (text and output_ids are the whole output so far) and
deltas with `--incremental-streaming-output`; 0.5.2 sent cumulative text with delta ids. The mode is
read off the chunks, never configured: a non-final cumulative chunk carries exactly
`completion_tokens` ids, a delta carries fewer once anything has arrived. 0.5.2 is told apart by
its meta_info, which lacks `num_retractions`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from workers.errors import PermanentError, TransientError, UpstreamAborted


@dataclass
class StreamAssembler:
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    finish_reason: dict[str, Any] | None = None
    ids_cumulative: bool | None = None  # None until a chunk decides it
    chunks: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def feed(self, chunk: dict[str, Any]) -> None:
        """Add one decoded `data:` chunk; raises a typed error for error chunks and aborts."""
        if "error" in chunk:
            raise error_from_chunk(chunk["error"])
        self.chunks += 1
        meta = chunk.get("meta_info") or {}
        ids = chunk.get("output_ids") or []
        text = chunk.get("text") or ""
        final = meta.get("finish_reason") is not None
        if self.ids_cumulative is None and self.output_ids and not final:
            self.ids_cumulative = len(ids) == meta.get("completion_tokens")
        ids_cumulative = self.ids_cumulative is not False
        # 0.5.23 streams text the way it streams ids; 0.5.2 always streamed cumulative text.
        text_cumulative = ids_cumulative or "num_retractions" not in meta
        # json.loads gave a fresh list: keep it (cumulative) or extend in place (deltas), no copies.
        if ids_cumulative:
            self.output_ids = ids
        else:
            self.output_ids.extend(ids)
        self.text = text if text_cumulative else self.text + text
        self.meta.update(meta)
        if final:
            self.finish_reason = meta["finish_reason"]
            if self.finish_reason.get("type") == "abort":
                raise abort_error(self.finish_reason)


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
        retryable = code >= 500 or code in (408, 429)
    if retryable is None:
        retryable = not INVALID_REQUEST.search(message)
    return (TransientError if retryable else PermanentError)(f"upstream error: {message}")


def abort_error(finish_reason: dict[str, Any]) -> TransientError | PermanentError:
    message = finish_reason.get("message") or "aborted"
    status = finish_reason.get("status_code")
    if isinstance(status, int) and 400 <= status < 500 and status not in (408, 429):
        return PermanentError(f"upstream aborted ({status}): {message}")
    return UpstreamAborted(f"upstream aborted ({status}): {message}")
