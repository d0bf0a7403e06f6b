"""Assembles an OpenAI-style `/v1/chat/completions` stream from SGLang, where the server has
already split reasoning (`delta.reasoning_content`) from content (`delta.content`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from genfleet.workers.errors import IntegrityError, UpstreamAborted
from genfleet.workers.sglang.wire_errors import error_from_chunk

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
            reasoning, content = delta.get("reasoning_content") or "", delta.get("content") or ""
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
