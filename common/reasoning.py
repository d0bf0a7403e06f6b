"""Reasoning parsers named as SGLang names them, as data: start/end markers and whether the output
starts inside reasoning (the chat template opened `<think>` in the prompt).

Unlike SGLang's non-streaming parser we never strip whitespace: `reasoning + end marker + content`
reproduces the model's text exactly, which token-exact training data needs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class ReasoningFormat:
    name: str
    start: str
    end: str
    # True: the template opens reasoning in the prompt, so the output starts inside it.
    forced: bool
    # chat_template_kwargs key that turns thinking off when False (None: cannot be turned off).
    toggle: str | None = None
    # Markers that also close reasoning (a tool call), kept in the content.
    also_ends: tuple[str, ...] = ()


REASONING_FORMATS: dict[str, ReasoningFormat] = {
    f.name: f
    for f in (
        ReasoningFormat("kimi_k2", "<think>", "</think>", forced=True, toggle="thinking",
                        also_ends=("<|tool_calls_section_begin|>",)),
        ReasoningFormat("deepseek-r1", "<think>", "</think>", forced=True),
        ReasoningFormat("qwen3", "<think>", "</think>", forced=True, toggle="enable_thinking",
                        also_ends=("<tool_call>",)),
        ReasoningFormat("qwen3-thinking", "<think>", "</think>", forced=True),
        ReasoningFormat("glm45", "<think>", "</think>", forced=True, toggle="enable_thinking",
                        also_ends=("<tool_call>",)),
        ReasoningFormat("kimi", "◁think▷", "◁/think▷", forced=False),
    )
}
NO_REASONING = "none"
PARSER_NAMES = (*REASONING_FORMATS, NO_REASONING)


@dataclass(frozen=True)
class ReasoningSplit:
    reasoning: str
    content: str
    # The end marker was seen; False with reasoning text means generation stopped mid-thought.
    closed: bool


class UnknownParserError(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(f"unknown reasoning parser {name!r}; choose one of {', '.join(PARSER_NAMES)}")


def get_format(name: str) -> ReasoningFormat | None:
    if name == NO_REASONING:
        return None
    try:
        return REASONING_FORMATS[name]
    except KeyError:
        raise UnknownParserError(name) from None


def starts_in_reasoning(fmt: ReasoningFormat, chat_template_kwargs: Mapping[str, Any] | None) -> bool:
    if fmt.toggle and chat_template_kwargs and chat_template_kwargs.get(fmt.toggle) is False:
        return False
    return fmt.forced


def split_reasoning(text: str, parser: str,
                    chat_template_kwargs: Mapping[str, Any] | None = None) -> ReasoningSplit:
    """Split a complete generation into reasoning and content."""
    fmt = get_format(parser)
    if fmt is None:
        return ReasoningSplit("", text, closed=False)
    start_at = text.find(fmt.start)
    if start_at != -1 and not text[:start_at].strip():
        # The model opened reasoning itself (or the template did not): drop the marker.
        text = text[start_at + len(fmt.start):]
    elif not starts_in_reasoning(fmt, chat_template_kwargs):
        return ReasoningSplit("", text, closed=False)
    end_at, marker_len = _first_marker(text, fmt)
    if end_at == -1:
        return ReasoningSplit(text, "", closed=False)
    return ReasoningSplit(text[:end_at], text[end_at + marker_len:], closed=True)


def _first_marker(text: str, fmt: ReasoningFormat) -> tuple[int, int]:
    """Position and length to cut at: the end marker is dropped, a tool-call marker is kept."""
    best = (text.find(fmt.end), len(fmt.end))
    for marker in fmt.also_ends:
        at = text.find(marker)
        if at != -1 and (best[0] == -1 or at < best[0]):
            best = (at, 0)
    return best
