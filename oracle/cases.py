"""Seeded generator of model outputs, request toggles and chunkings for the differential test.

Two families per parser:
* `shaped`: what the format's model really emits, with its variations (start marker written by
  the model or opened by the template, empty / whitespace-only / multi-byte reasoning and content,
  tool-call markers, truncation with no end marker, a partial marker cut off at the end).
* `soup`: random sequences of words and of every format's markers, in any order.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

THINK_START, THINK_END = "<think>", "</think>"
KIMI_START, KIMI_END = "◁think▷", "◁/think▷"
K2_TOOLS = "<|tool_calls_section_begin|>"
TOOL_CALL = "<tool_call>"
H_START, H_CHANNEL, H_MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
H_END, H_RETURN, H_CALL, H_CONSTRAIN = "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"

WORDS = [
    "plain", "words", "the", "answer", "is", "42", "step", "one", "two", "Let", "me", "check",
    "思考", "答案是", "中文", "日本語", "한국어", "🤔", "👍🏽", "🚀", "é", "ß", "naïve",
    "a < b", "x > y", "1/2", "<b>", "</b>", "<|x|>", "|", "thinking", "think", "end",
    "{\"k\": 1}", "```py", "print()", "```",
]
SPACES = [" ", "  ", "\n", "\n\n", "\t", " \n "]

ALL_MARKERS = [
    THINK_START, THINK_END, KIMI_START, KIMI_END, K2_TOOLS, TOOL_CALL, "</tool_call>",
    "<|tool_call_begin|>", "<|tool_call_end|>", "<|tool_calls_section_end|>",
    H_START, H_CHANNEL, H_MESSAGE, H_END, H_RETURN, H_CALL, H_CONSTRAIN,
    H_CHANNEL + "analysis" + H_MESSAGE, H_START + "assistant" + H_CHANNEL + "final" + H_MESSAGE,
    "analysis", "final", "commentary",
]

THINK_FORMATS: dict[str, dict[str, Any]] = {
    "kimi_k2": {"start": THINK_START, "end": THINK_END, "tools": (K2_TOOLS,), "toggle": "thinking"},
    "deepseek-r1": {"start": THINK_START, "end": THINK_END, "tools": (), "toggle": None},
    "qwen3": {"start": THINK_START, "end": THINK_END, "tools": (TOOL_CALL,), "toggle": "enable_thinking"},
    "qwen3-thinking": {"start": THINK_START, "end": THINK_END, "tools": (TOOL_CALL,), "toggle": None},
    "glm45": {"start": THINK_START, "end": THINK_END, "tools": (TOOL_CALL,), "toggle": "enable_thinking"},
    "kimi": {"start": KIMI_START, "end": KIMI_END, "tools": (), "toggle": None},
}

KWARGS_CHOICES: list[dict[str, Any] | None] = [
    None, {}, {"thinking": False}, {"thinking": True}, {"enable_thinking": False},
    {"enable_thinking": True}, {"thinking": False, "enable_thinking": False},
]


@dataclass
class Case:
    parser: str
    family: str
    text: str
    kwargs: dict[str, Any] | None
    chunks: list[str] = field(default_factory=list)
    chunking: str = ""


def _words(rng: random.Random, lo: int = 0, hi: int = 8) -> str:
    kind = rng.random()
    if kind < 0.08:
        return ""
    if kind < 0.16:
        return "".join(rng.choice(SPACES) for _ in range(rng.randint(1, 3)))
    out = []
    for _ in range(rng.randint(max(lo, 1), hi)):
        out.append(rng.choice(WORDS))
        out.append(rng.choice([" ", " ", " ", "", "\n"]))
    text = "".join(out)
    if rng.random() < 0.2:
        text = rng.choice(SPACES) + text
    if rng.random() < 0.2:
        text = text + rng.choice(SPACES)
    return text


def _partial(marker: str, rng: random.Random) -> str:
    return marker[: rng.randint(1, len(marker) - 1)]


def shaped_think(parser: str, rng: random.Random) -> str:
    fmt = THINK_FORMATS[parser]
    parts: list[str] = []
    if rng.random() < 0.5:  # the model writes the start marker itself (template did not)
        if rng.random() < 0.1:
            parts.append(rng.choice(SPACES))  # whitespace before it
        parts.append(fmt["start"])
    parts.append(_words(rng))
    ending = rng.random()
    tools = fmt["tools"]
    if ending < 0.55:
        parts += [fmt["end"], _words(rng)]
        if tools and rng.random() < 0.25:  # a tool call after the answer
            parts += [tools[0], _words(rng, 1, 3)]
    elif ending < 0.7 and tools:
        # tool call straight out of reasoning, no end marker
        parts += [tools[0], _words(rng, 1, 4)]
        if rng.random() < 0.3:
            parts += [fmt["end"], _words(rng)]
    elif ending < 0.85:
        pass  # truncated inside reasoning (max_tokens)
    else:
        parts.append(_partial(fmt["end"], rng))  # truncated in the middle of the end marker
    if rng.random() < 0.1:  # a stray partial marker at the very end
        markers = [fmt["end"], fmt["start"], *tools] if tools else [fmt["end"], fmt["start"]]
        parts.append(_partial(rng.choice(markers), rng))
    return "".join(parts)


def _harmony_body(rng: random.Random) -> str:
    return _words(rng)


def shaped_harmony(rng: random.Random) -> str:
    """gpt-oss output: the prompt ends with `<|start|>assistant`, so the first message has no
    `<|start|>`; later ones do. Generation stops at <|return|> / <|call|> (usually not in the
    text, sometimes kept)."""
    blocks: list[str] = []
    first = True

    def header(channel: str) -> str:
        nonlocal first
        head = ("" if first else H_START + "assistant") + H_CHANNEL + channel
        first = False
        return head

    for _ in range(rng.randint(0, 2)):
        blocks.append(header("analysis") + H_MESSAGE + _harmony_body(rng) + H_END)
        if rng.random() < 0.2:
            blocks.append(header("commentary") + H_MESSAGE + _harmony_body(rng) + H_END)  # preamble
    last = rng.random()
    if last < 0.45:
        blocks.append(header("final") + H_MESSAGE + _harmony_body(rng) + (H_RETURN if rng.random() < 0.3 else ""))
    elif last < 0.65:
        blocks.append(header("commentary to=functions.get_weather ") + H_CONSTRAIN + "json" + H_MESSAGE
                      + '{"city": "東京"}' + (H_CALL if rng.random() < 0.7 else ""))
    elif last < 0.75:
        blocks.append(header("analysis to=browser.search ") + H_CONSTRAIN + "json" + H_MESSAGE
                      + '{"q": "sglang"}' + H_CALL)
    elif last < 0.9:
        blocks.append(header("analysis") + H_MESSAGE + _harmony_body(rng))  # truncated reasoning
    text = "".join(blocks)
    if text and rng.random() < 0.15:  # truncated anywhere (max_tokens), possibly inside a marker
        text = text[: rng.randint(0, len(text))]
    return text


def soup(rng: random.Random) -> str:
    pieces = []
    for _ in range(rng.randint(0, 10)):
        pieces.append(rng.choice(ALL_MARKERS) if rng.random() < 0.45 else _words(rng, 1, 2))
    text = "".join(pieces)
    if rng.random() < 0.15:
        text += _partial(rng.choice([m for m in ALL_MARKERS if len(m) > 1]), rng)
    return text


def shaped(parser: str, rng: random.Random) -> str:
    if parser in THINK_FORMATS:
        return shaped_think(parser, rng)
    if parser == "gpt-oss":
        return shaped_harmony(rng)
    # none: any of the others' outputs
    return shaped(rng.choice([*THINK_FORMATS, "gpt-oss"]), rng)


def chunk(text: str, rng: random.Random) -> tuple[list[str], str]:
    """Chunkings a server can produce: whole tokens (markers are single special tokens, so they
    arrive whole), SGLang's stream_interval batches of several tokens, arbitrary cuts, and one
    character at a time."""
    how = rng.random()
    if not text:
        return [""], "empty"
    if how < 0.35:
        toks = _tokens(text)
        chunks, i = [], 0
        while i < len(toks):
            n = rng.choice([1, 1, 1, 2, 3, 8])
            chunks.append("".join(toks[i:i + n]))
            i += n
        return chunks, "tokens"
    if how < 0.7:
        cuts = sorted({rng.randint(1, max(1, len(text) - 1)) for _ in range(rng.randint(0, 6))})
        bounds = [0, *[c for c in cuts if 0 < c < len(text)], len(text)]
        return [text[a:b] for a, b in pairwise(bounds)], "random-cuts"
    if how < 0.85:
        return list(text), "chars"
    return [text], "one-chunk"


_TOKEN_MARKERS = sorted({m for m in ALL_MARKERS if m.startswith(("<", "◁"))}, key=len, reverse=True)


def _tokens(text: str) -> list[str]:
    """Markers whole, other text in small pieces (a word or a few characters)."""
    out, i = [], 0
    while i < len(text):
        for m in _TOKEN_MARKERS:
            if text.startswith(m, i):
                out.append(m)
                i += len(m)
                break
        else:
            j = i + 1
            while j < len(text) and j - i < 4 and not text[j].isspace() and not text.startswith(("<", "◁"), j):
                j += 1
            out.append(text[i:j])
            i = j
    return out


def generate(parser: str, count: int, seed: int) -> list[Case]:
    rng = random.Random(f"{seed}:{parser}")
    cases = []
    for n in range(count):
        family = "soup" if n % 4 == 3 else "shaped"
        text = soup(rng) if family == "soup" else shaped(parser, rng)
        kwargs = rng.choice(KWARGS_CHOICES)
        chunks, how = chunk(text, rng)
        cases.append(Case(parser, family, text, kwargs, chunks, how))
    return cases
