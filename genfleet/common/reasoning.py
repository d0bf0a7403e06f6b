"""Reasoning parsers named as SGLang names them, as data: start/end markers and whether the output
starts inside reasoning (the chat template opened `<think>` in the prompt).

One streaming implementation serves both uses: `ReasoningStream` takes text deltas in any
chunking (a marker split across chunks is still found) and `split_reasoning` is the same parser
fed the whole text at once, so live and final splits can never disagree.

We never strip whitespace (older SGLang releases did; 0.5.23 no longer does): `reasoning + end
marker + content` reproduces the model's text exactly, which token-exact training data needs.
How this table compares with SGLang 0.5.23's own parsers, text by text and chunk by chunk, is in
docs/reasoning-formats.md (`make oracle`).
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from genfleet.common import GenfleetError


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
    # Harmony (gpt-oss): channels instead of think markers.
    harmony: bool = False


REASONING_FORMATS: dict[str, ReasoningFormat] = {
    f.name: f
    for f in (
        ReasoningFormat("kimi_k2", "<think>", "</think>", forced=True, toggle="thinking",
                        also_ends=("<|tool_calls_section_begin|>",)),
        ReasoningFormat("deepseek-r1", "<think>", "</think>", forced=True),
        ReasoningFormat("qwen3", "<think>", "</think>", forced=True, toggle="enable_thinking",
                        also_ends=("<tool_call>",)),
        # SGLang maps qwen3-thinking to its Qwen3Detector: a <tool_call> also ends reasoning.
        ReasoningFormat("qwen3-thinking", "<think>", "</think>", forced=True, also_ends=("<tool_call>",)),
        ReasoningFormat("glm45", "<think>", "</think>", forced=True, toggle="enable_thinking",
                        also_ends=("<tool_call>",)),
        ReasoningFormat("kimi", "◁think▷", "◁/think▷", forced=False),
        ReasoningFormat("gpt-oss", "<|channel|>analysis<|message|>", "<|end|>", forced=True, harmony=True),
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


class UnknownParserError(GenfleetError, ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(f"unknown reasoning parser {name!r}; choose one of {', '.join(PARSER_NAMES)}")


def get_format(name: str) -> ReasoningFormat | None:
    if name == NO_REASONING:
        return None
    try:
        return REASONING_FORMATS[name]
    except KeyError:
        raise UnknownParserError(name) from None


def starts_in_reasoning(fmt: ReasoningFormat | None, chat_template_kwargs: Mapping[str, Any] | None) -> bool:
    if fmt is None:
        return False
    if fmt.toggle and chat_template_kwargs and chat_template_kwargs.get(fmt.toggle) is False:
        return False
    return fmt.forced


def split_reasoning(text: str, parser: str,
                    chat_template_kwargs: Mapping[str, Any] | None = None) -> ReasoningSplit:
    """Split a complete generation into reasoning and content."""
    stream = ReasoningStream(parser, chat_template_kwargs)
    stream.feed(text)
    stream.finish()
    return stream.result()


class ReasoningStream:
    """Feeds text deltas in, accumulates reasoning and content; `finish()` at the end of stream."""

    def __init__(self, parser: str, chat_template_kwargs: Mapping[str, Any] | None = None) -> None:
        fmt = get_format(parser)
        self._impl: _ThinkMarkers | _Harmony | None
        if fmt is None:
            self._impl = None
        elif fmt.harmony:
            self._impl = _Harmony()
        else:
            self._impl = _ThinkMarkers(fmt, starts_in_reasoning(fmt, chat_template_kwargs))
        self.reasoning = ""
        self.content = ""

    def feed(self, delta: str) -> None:
        if self._impl is None:
            self.content += delta
            return
        reasoning, content = self._impl.feed(delta)
        self.reasoning += reasoning
        self.content += content

    def finish(self) -> None:
        if self._impl is not None:
            reasoning, content = self._impl.finish()
            self.reasoning += reasoning
            self.content += content

    def result(self) -> ReasoningSplit:
        closed = self._impl.closed if self._impl is not None else False
        return ReasoningSplit(self.reasoning, self.content, closed)


class _ThinkMarkers:
    """`<think>…</think>`-style formats. Holds back only a tail that could begin a marker."""

    def __init__(self, fmt: ReasoningFormat, forced: bool) -> None:
        self.fmt, self.forced = fmt, forced
        self.state = "start"  # "start" → "reasoning" → "content"
        self.buffer = ""
        self.closed = False
        self.stoppers = (fmt.end, *fmt.also_ends)

    def feed(self, delta: str) -> tuple[str, str]:
        self.buffer += delta
        lead_reasoning = lead_content = ""
        if self.state == "start":
            head = self.buffer.lstrip()
            if not head or (len(head) < len(self.fmt.start) and self.fmt.start.startswith(head)):
                return "", ""  # might still be the model opening <think>
            if head.startswith(self.fmt.start):
                # Whitespace before the model's own start marker is kept, on the side the output
                # was on when it came (as SGLang streams it): reasoning if forced, else content.
                lead = self.buffer[: len(self.buffer) - len(head)]
                if self.forced:
                    lead_reasoning = lead
                else:
                    lead_content = lead
                self.buffer = head[len(self.fmt.start):]
                self.state = "reasoning"
            else:
                self.state = "reasoning" if self.forced else "content"
        reasoning, content = self._consume()
        return lead_reasoning + reasoning, lead_content + content

    def _consume(self) -> tuple[str, str]:
        if self.state == "reasoning":
            at, marker = self._first_stopper()
            if at == -1:
                keep = _partial_marker_tail(self.buffer, self.stoppers)
                reasoning, self.buffer = self.buffer[: len(self.buffer) - keep], self.buffer[len(self.buffer) - keep:]
                return reasoning, ""
            reasoning = self.buffer[:at]
            # The end marker is dropped; a tool-call marker belongs to the content.
            rest = self.buffer[at + len(marker):] if marker == self.fmt.end else self.buffer[at:]
            self.buffer, self.state, self.closed = "", "content", True
            return reasoning, rest
        content, self.buffer = self.buffer, ""
        return "", content

    def finish(self) -> tuple[str, str]:
        rest, self.buffer = self.buffer, ""
        if self.state == "reasoning" or (self.state == "start" and self.forced):
            return rest, ""
        return "", rest

    def _first_stopper(self) -> tuple[int, str]:
        found = [(self.buffer.find(m), m) for m in self.stoppers]
        found = [(at, m) for at, m in found if at != -1]
        return min(found) if found else (-1, "")


class _Harmony:
    """gpt-oss Harmony, routed as SGLang 0.5.23's HarmonyParser routes a complete text:
    `<|channel|>analysis<|message|>…<|end|>` is reasoning, the `final` channel's body is content,
    a `commentary` message closed by `<|end|>` (a preamble) gives its body to the content, and a
    tool call (any channel closed by `<|call|>`, built-in tools on `analysis` included) goes to the
    content verbatim, framing and all, for a tool-call parser. Text outside any message is content.
    Messages are emitted whole, when their terminator arrives, so any chunking gives the same
    split; what is left at the end is routed as an unterminated message. Only the framing of
    routed messages and a stray terminator outside any message (as SGLang) are dropped."""

    TERMINATORS = ("<|end|>", "<|return|>", "<|call|>")
    CHANNELS = ("analysis", "commentary", "final")
    MESSAGE = re.compile(r"(?:<\|start\|>[^<]*)?<\|channel\|>(?P<header>.*?)<\|message\|>(?P<body>.*)", re.S)

    def __init__(self) -> None:
        self.buffer = ""
        self.closed = False

    def feed(self, delta: str) -> tuple[str, str]:
        self.buffer += delta
        reasoning = content = ""
        while True:
            ends = [(self.buffer.find(t), t) for t in self.TERMINATORS]
            ends = [(at, t) for at, t in ends if at != -1]
            if not ends:
                return reasoning, content
            at, terminator = min(ends)
            message, self.buffer = self.buffer[:at], self.buffer[at + len(terminator):]
            r, c = self._route(message, terminator)
            reasoning, content = reasoning + r, content + c

    def finish(self) -> tuple[str, str]:
        message, self.buffer = self.buffer, ""
        return self._route(message, "") if message else ("", "")

    def _route(self, message: str, terminator: str) -> tuple[str, str]:
        match = self.MESSAGE.search(message)
        if match is None:
            return "", message
        # Text before the header (outside any message) is content, as SGLang emits it.
        outside, framed = message[: match.start()], message[match.start():]
        # The channel is what the header starts with (`commentary to=functions.f <|constrain|>json`).
        header = match["header"].strip().lower()
        channel = next((name for name in self.CHANNELS if header.startswith(name)), "")
        if terminator == "<|call|>":
            self.closed = True  # a complete tool call: the model did not stop mid-thought
            return "", outside + framed + terminator
        if channel == "analysis":
            self.closed = self.closed or bool(terminator)
            return match["body"], outside
        if channel == "final" or (channel == "commentary" and terminator == "<|end|>"):
            self.closed = self.closed or channel == "final"
            return "", outside + match["body"]
        return "", outside + framed + terminator


def _partial_marker_tail(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a marker."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:size]):
                longest = size
                break
    return longest
