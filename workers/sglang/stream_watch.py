"""Watches a stream as it arrives, for the loop guard: feeds each chunk's new token ids (or, over
the chat API, its new characters) to a `LoopDetector` and says when the stream should stop.

`abort` stops at the first loop found; `flag` only remembers it (the completion runs to its end and
is marked). The client then closes the stream and asks the server to drop the request.
"""
from __future__ import annotations

from collections.abc import Sequence

from genfleet.workers.loop_guard import Loop, LoopDetector, LoopThresholds

LOOP_POLICIES = ("abort", "flag", "off")


class StreamWatch:
    def __init__(self, policy: str, thresholds: LoopThresholds, prefix: Sequence[int] | str = ()) -> None:
        if policy not in ("abort", "flag"):
            raise ValueError(f"no stream watch for loop guard {policy!r}")
        self.abort = policy == "abort"
        self.detector = LoopDetector(thresholds, prefix=prefix)
        self._ids_seen = 0
        self._reasoning_seen = 0
        self._content_seen = 0

    @property
    def loop(self) -> Loop | None:
        return self.detector.found

    def ids_arrived(self, ids: list[int]) -> bool:
        """`ids`: every id assembled so far (cumulative or not); True: stop reading now."""
        new = ids[self._ids_seen:]
        self._ids_seen = len(ids)
        if new:
            self.detector.extend(new)
        return self.abort and self.detector.found is not None

    def text_arrived(self, reasoning: str, content: str) -> bool:
        """The chat API's reasoning and content so far; fed as one stream of characters."""
        new = reasoning[self._reasoning_seen:] + content[self._content_seen:]
        self._reasoning_seen, self._content_seen = len(reasoning), len(content)
        if new:
            self.detector.extend(new)
        return self.abort and self.detector.found is not None
