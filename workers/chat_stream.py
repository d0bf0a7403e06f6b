"""Assembles an OpenAI-style `/v1/chat/completions` stream from SGLang, where the server has
already split reasoning (`delta.reasoning_content`) from content (`delta.content`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workers.sglang_stream import error_from_chunk
from workers.errors import UpstreamAborted

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
            self.reasoning += delta.get("reasoning_content") or ""
            self.content += delta.get("content") or ""
            reason = choice.get("finish_reason")
            if reason is not None:
                self.finish_reason = {"type": FINISH_TYPES.get(reason, reason), "matched": choice.get("matched_stop")}
                if self.finish_reason["type"] == "abort":
                    raise UpstreamAborted(f"upstream aborted the chat stream ({reason})")
