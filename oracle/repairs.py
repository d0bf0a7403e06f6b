"""The repairs of the difference classes: each the smallest edit of a text or of its chunking that
removes one mechanism by which SGLang and genfleet differ. A repair returns the repaired chunks,
None when its mechanism is not in the case, or STOP when the case cannot be repaired but the
mechanism explains it."""
from __future__ import annotations

import re

from cases import H_CALL, H_END, H_RETURN, THINK_FORMATS, _tokens

from genfleet.common.reasoning import REASONING_FORMATS, starts_in_reasoning

STOP = "STOP"
Chunks = list[str]


def delete_spans(chunks: Chunks, spans: list[tuple[int, int]]) -> Chunks:
    """Remove [start, end) character ranges of the joined text, keeping the chunk boundaries."""
    out, pos = [], 0
    for chunk in chunks:
        kept = "".join(ch for i, ch in enumerate(chunk, pos) if not any(a <= i < b for a, b in spans))
        out.append(kept)
        pos += len(chunk)
    return [c for c in out if c] or [""]


def find_all(text: str, marker: str, start: int = 0) -> list[int]:
    out, at = [], text.find(marker, start)
    while at != -1:
        out.append(at)
        at = text.find(marker, at + len(marker))
    return out


def _think(parser: str) -> dict:
    return THINK_FORMATS[parser]


def _starts_in_reasoning(parser: str, kwargs) -> bool:
    return starts_in_reasoning(REASONING_FORMATS[parser], kwargs)


def repair_ws_before_start(parser, chunks, kwargs):
    text = "".join(chunks)
    m = re.match(r"\s+" + re.escape(_think(parser)["start"]), text)
    return delete_spans(chunks, [(0, m.end() - len(_think(parser)["start"]))]) if m else None


def repair_stray_start(parser, chunks, kwargs):
    text, start = "".join(chunks), _think(parser)["start"]
    spans = [(i, i + len(start)) for i in find_all(text, start) if i != 0]
    return delete_spans(chunks, spans) if spans else None


def repair_tool_then_end(parser, chunks, kwargs):
    fmt = _think(parser)
    text = "".join(chunks)
    opened = text.startswith(fmt["start"])
    if not (opened or _starts_in_reasoning(parser, kwargs)) or not fmt["tools"]:
        return None
    body = len(fmt["start"]) if opened else 0
    tool = min((i for t in fmt["tools"] for i in find_all(text, t, body)), default=-1)
    end = text.find(fmt["end"], body)
    if tool == -1 or end == -1 or end < tool:
        return None
    return delete_spans(chunks, [(i, i + len(fmt["end"])) for i in find_all(text, fmt["end"], tool)])


def _harmony_strategy(chunks: Chunks, whole: bool) -> str:
    from sglang.srt.parser.harmony_parser import HarmonyParser

    parser = HarmonyParser()
    for chunk in (["".join(chunks)] if whole else chunks):
        parser.parse(chunk)
    return type(parser.strategy).__name__ if parser.strategy else "None"


def repair_no_channel_markers(parser, chunks, kwargs):
    # Not repairable: SGLang reads such text with no Harmony framing at all. Explained when its
    # HarmonyParser never chose the canonical (marker) strategy; the repair gives up the case.
    return STOP if _harmony_strategy(chunks, whole=True) != "CanonicalStrategy" else None


def repair_no_channel_markers_stream(parser, chunks, kwargs):
    return STOP if _harmony_strategy(chunks, whole=False) != "CanonicalStrategy" else None


H_TERMINATORS = (H_END, H_RETURN, H_CALL)
H_STRUCTURAL = ("<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", *H_TERMINATORS)
_HARMONY_MSG = re.compile(r"(?:<\|start\|>[^<]*)?<\|channel\|>(?P<header>.*?)<\|message\|>", re.S)


def _held_by_sglang(chunks: Chunks, whole: bool) -> str:
    """What SGLang's HarmonyParser still holds in its buffer at the end: GptOssDetector has no
    finish() of its own and the one-shot path's extra parse("") does not flush it either."""
    from sglang.srt.parser.harmony_parser import HarmonyParser

    parser = HarmonyParser()
    for chunk in (["".join(chunks)] if whole else chunks):
        parser.parse(chunk)
    parser.parse("")
    return parser._buffer


def _repair_held_tail(chunks: Chunks, whole: bool):
    text = "".join(chunks)
    held = _held_by_sglang(chunks, whole)
    if not held or not text.endswith(held):
        return None
    return delete_spans(chunks, [(len(text) - len(held), len(text))])


def repair_held_tail(parser, chunks, kwargs):
    return _repair_held_tail(chunks, whole=True)


def repair_held_tail_stream(parser, chunks, kwargs):
    return _repair_held_tail(chunks, whole=False)


def _segments(text: str):
    """genfleet's Harmony segmentation: (start, end of body, terminator) per message."""
    pos = 0
    while pos < len(text):
        ends = [(text.find(t, pos), t) for t in H_TERMINATORS]
        ends = [(at, t) for at, t in ends if at != -1]
        at, term = min(ends) if ends else (len(text), "")
        yield pos, at, term
        pos = at + len(term)


def _channel(header: str) -> str:
    """SGLang's CanonicalStrategy._extract_channel_type (and genfleet's): what the header starts with."""
    header = header.strip().lower()
    return next((name for name in ("analysis", "commentary", "final") if header.startswith(name)), "")


# The terminators SGLang's CanonicalStrategy._parse_block accepts per channel.
SGLANG_TERMINATORS = {"final": (H_RETURN,), "analysis": (H_END, H_CALL), "commentary": (H_END, H_CALL)}


def repair_channel_terminators(parser, chunks, kwargs):
    """Delete a terminator that closes a message whose channel SGLang does not end with it."""
    text = "".join(chunks)
    for start, at, term in _segments(text):
        m = _HARMONY_MSG.search(text, start, at)
        if m and term and term not in SGLANG_TERMINATORS.get(_channel(m["header"]), H_TERMINATORS):
            return delete_spans(chunks, [(at, at + len(term))])
    return None


def repair_commentary_filter(parser, chunks, kwargs):
    """Delete content pieces SGLang's HarmonyParser filters as 'commentary' filler once it has seen
    a tool call or its buffer ends in <|call|>: text whose stripped, lower-cased form is a prefix of
    'commentary' (so whitespace-only text too), outside messages or as a commentary message body."""
    text = "".join(chunks)
    if H_CALL not in text:
        return None
    spans = []
    for start, at, term in _segments(text):
        m = _HARMONY_MSG.search(text, start, at)
        pieces = [(start, m.start() if m else at)]
        if m and _channel(m["header"]) == "commentary" and term == H_END:
            pieces.append((m.end(), at))
        for a, b in pieces:
            body = text[a:b]
            if any(tok in body for tok in H_STRUCTURAL) or not body:
                continue
            if "commentary".startswith(body.strip().lower()):
                spans.append((a, b))
    return delete_spans(chunks, spans) if spans else None


def repair_analysis_tool_call(parser, chunks, kwargs):
    """Delete a built-in tool call on the analysis channel (…analysis to=browser.search…<|call|>)."""
    text = "".join(chunks)
    for start, at, term in _segments(text):
        m = _HARMONY_MSG.search(text, start, at)
        if m and term == H_CALL and m["header"].strip().split()[:1] == ["analysis"]:
            return delete_spans(chunks, [(m.start(), at + len(term))])
    return None


def repair_stray_tokens(parser, chunks, kwargs):
    """Delete structural tokens outside any message (SGLang filters them out)."""
    text, spans = "".join(chunks), []
    for start, at, _term in _segments(text):
        m = _HARMONY_MSG.search(text, start, at)
        outside_end = m.start() if m else at
        for tok in H_STRUCTURAL:
            spans += [(i, i + len(tok)) for i in find_all(text[:outside_end], tok, start)]
    return delete_spans(chunks, spans) if spans else None


def repair_rechunk_tokens(parser, chunks, kwargs):
    """Stream only: re-chunk one token per chunk, markers whole (as a tokenizer emits them)."""
    text = "".join(chunks)
    tokens = _tokens(text)
    return tokens if tokens != chunks else None


def repair_one_chunk(parser, chunks, kwargs):
    text = "".join(chunks)
    return [text] if chunks != [text] else None
