"""Assembles SGLang `/generate` stream chunks into one generation and proves it adds up.

Whether chunks are cumulative (the default: each carries the whole text and ids so far) or deltas
(`--incremental-streaming-output`) is a server setting, read once per upstream from `/server_info`
(`StreamMode`). Only where a server or router does not say is the mode inferred, from the one fact
every chunk carries in both modes: `meta_info.completion_tokens`, the count of ids sent so far
(sglang 0.5.23 `managers/scheduler_components/output_streamer.py`: `completion_tokens =
len(output_ids_through_stop)`). Once any id has arrived, a cumulative chunk carries exactly
`completion_tokens` ids and a delta carries `completion_tokens - assembled`; the two can only be
equal before the first id, when both modes read the same. So the first chunk that reports its count
after an id has arrived decides, final or not.
0.5.2 sent cumulative text with delta ids; it is told apart by a meta_info without `num_retractions`.

Integrity: every chunk is checked against what came before (a cumulative chunk's text extends the
previous one; the ids add up to `completion_tokens`), and a stream whose assembled ids differ from
its final `completion_tokens` raises `IntegrityError`: a dropped, duplicated or reordered chunk is
never written as a record.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from genfleet.workers.errors import IntegrityError
from genfleet.workers.sglang.wire_errors import abort_error, error_from_chunk


@dataclass(frozen=True)
class StreamMode:
    """What a server said about its streaming (`/server_info`); `incremental=None`: it did not say."""

    incremental: bool | None = None
    stream_interval: int | None = None

    @classmethod
    def from_server_info(cls, info: Any) -> StreamMode:
        """sglang 0.5.23 `utils/common.py::build_server_info` returns `server_args.resolved_dict()`
        flat, so `incremental_streaming_output` and `stream_interval` are top-level keys."""
        if not isinstance(info, dict):
            return cls()
        incremental = info.get("incremental_streaming_output")
        interval = info.get("stream_interval")
        return cls(incremental if isinstance(incremental, bool) else None,
                   interval if isinstance(interval, int) and not isinstance(interval, bool) else None)


UNKNOWN = StreamMode()


@dataclass
class StreamAssembler:
    # What the server said; None: infer it from the chunks.
    incremental: bool | None = None
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    finish_reason: dict[str, Any] | None = None
    # Decided by the server's word or by the first chunk after an id has arrived; None until then.
    ids_cumulative: bool | None = None
    chunks: int = 0

    def __post_init__(self) -> None:
        if self.incremental is not None:
            self.ids_cumulative = not self.incremental

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def feed(self, chunk: dict[str, Any]) -> None:
        """Add one decoded `data:` chunk; raises a typed error for error chunks, aborts and any chunk
        that contradicts the stream so far."""
        if "error" in chunk:
            raise error_from_chunk(chunk["error"])
        self.chunks += 1
        meta = chunk.get("meta_info") or {}
        finish_reason = meta.get("finish_reason")
        if finish_reason is not None and finish_reason.get("type") == "abort":
            self.finish_reason = finish_reason
            raise abort_error(finish_reason)
        ids = chunk.get("output_ids") or []
        text = chunk.get("text") or ""
        sent = meta.get("completion_tokens")
        if not isinstance(sent, int):
            sent = None
        if self.ids_cumulative is None and self.output_ids:
            self.ids_cumulative = self._infer_cumulative(len(ids), sent)
        if self.ids_cumulative is None or self.ids_cumulative:
            # json.loads gave a fresh list: keep it, no copy. Before any id, both modes read the same.
            self._check_extends(ids, text)
            self.output_ids = ids
            self.text = text
        else:
            self.output_ids.extend(ids)
            # 0.5.23 streams text the way it streams ids; 0.5.2 always streamed cumulative text.
            if "num_retractions" in meta or self.incremental:
                self.text += text
            else:
                self._check_text_extends(text)
                self.text = text
        if sent is not None and len(self.output_ids) != sent:
            raise IntegrityError(self._describe(f"{len(self.output_ids)} ids assembled but completion_tokens "
                                                f"says {sent}"))
        self.meta.update(meta)
        if finish_reason is not None:
            if sent is None:
                raise IntegrityError(self._describe("the final chunk reports no completion_tokens"))
            self.finish_reason = finish_reason

    def _infer_cumulative(self, count: int, sent: int | None) -> bool | None:
        if sent is None:
            return None  # decided by a later chunk that carries its count
        have = len(self.output_ids)
        if count == sent:
            return True  # a delta would carry sent - have < sent ids
        if count == sent - have:
            return False
        raise IntegrityError(self._describe(f"a chunk of {count} ids after {have} with completion_tokens {sent} "
                                            "is neither cumulative nor a delta"))

    def _check_extends(self, ids: list[int], text: str) -> None:
        # The ids are checked at the boundary only (the count is checked on every chunk): a full
        # comparison would make a cumulative stream cost O(n) per chunk on top of its parse.
        have = len(self.output_ids)
        if have and (len(ids) < have or ids[have - 1] != self.output_ids[-1]):
            raise IntegrityError(self._describe("a cumulative chunk's ids do not extend the previous chunk's"))
        self._check_text_extends(text)

    def _check_text_extends(self, text: str) -> None:
        if not text.startswith(self.text):
            raise IntegrityError(self._describe("a cumulative chunk's text does not extend the previous chunk's"))

    def _describe(self, problem: str) -> str:
        mode = {None: "mode not yet known", True: "cumulative", False: "incremental"}[self.ids_cumulative]
        said = "" if self.incremental is None else " (as the server reports)"
        return f"stream integrity: {problem} at chunk {self.chunks} ({mode}{said})"
