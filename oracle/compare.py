"""Differential test: genfleet's reasoning splitter against SGLang 0.5.23's own parsers.

    .oracle-venv/bin/python oracle/compare.py [--cases N] [--seed S] [--out oracle/results.md]

For each of genfleet's eight parser names, N generated outputs (see cases.py), each with a
request's chat_template_kwargs and a chunking, are split four ways:

* genfleet: `split_reasoning(text)` and `ReasoningStream` fed the same chunks (they must agree:
  checked, a failure is a genfleet bug);
* SGLang non-stream: what `/v1/chat/completions` returns as `reasoning_content` / `content`;
* SGLang stream: the concatenated `reasoning_content` / `content` deltas of the streamed response
  (see sglang_side.py for how the server drives the parser).

Each SGLang result is `agree` (equal strings), `agree-ws` (equal after .strip() of each field,
SGLang's traditional normalisation) or `differ`. Every result that is not `agree` must be
explained by a known difference class (CLASSES, documented in docs/reasoning-formats.md): a class
names a mechanism and a repair, the smallest edit of the text or of its chunking that removes that
mechanism; a result is explained when its classes' repairs, applied in turn, make both sides
agree exactly. Anything left over is UNEXPLAINED and fails the run (exit 1).
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import sglang_side as sg  # noqa: E402
from cases import (  # noqa: E402
    H_CALL, H_END, H_RETURN, THINK_FORMATS, Case, _tokens, generate,
)

from common.reasoning import (  # noqa: E402
    PARSER_NAMES, REASONING_FORMATS, ReasoningStream, split_reasoning, starts_in_reasoning,
)

MODES = ("non-stream", "stream")
Pair = tuple[str, str]


# --- the two sides ----------------------------------------------------------------------------------
def ours_whole(parser: str, text: str, kwargs) -> Pair:
    split = split_reasoning(text, parser, kwargs)
    return split.reasoning, split.content


def ours_stream(parser: str, chunks: list[str], kwargs) -> Pair:
    stream = ReasoningStream(parser, kwargs)
    for chunk in chunks:
        stream.feed(chunk)
    stream.finish()
    return stream.reasoning, stream.content


def theirs(mode: str, parser: str, chunks: list[str], kwargs) -> Pair:
    if mode == "non-stream":
        out = sg.non_stream(parser, "".join(chunks), kwargs)
    else:
        out = sg.stream(parser, chunks, kwargs)
    return out.reasoning, out.content


def verdict(ours: Pair, sglang: Pair) -> str:
    if ours == sglang:
        return "agree"
    if ours[0].strip() == sglang[0].strip() and ours[1].strip() == sglang[1].strip():
        return "agree-ws"
    return "differ"


# --- difference classes -----------------------------------------------------------------------------
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


@dataclass(frozen=True)
class DiffClass:
    name: str
    modes: tuple[str, ...]
    # "think" (the <think>/◁think▷ formats), "harmony" (gpt-oss) or "any".
    formats: str
    # Returns the repaired chunks, or None when the mechanism is not present in this case.
    repair: Callable[[str, Chunks, dict | None], Chunks | None]
    # Which side the reference page says is right.
    right: str
    summary: str


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
    return "STOP" if _harmony_strategy(chunks, whole=True) != "CanonicalStrategy" else None


def repair_no_channel_markers_stream(parser, chunks, kwargs):
    return "STOP" if _harmony_strategy(chunks, whole=False) != "CanonicalStrategy" else None


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
    for start, at, term in _segments(text):
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


CLASSES: list[DiffClass] = [
    DiffClass("ws-before-start", MODES, "think", repair_ws_before_start, "genfleet",
              "whitespace before a start marker the model wrote: SGLang's non-stream parser only "
              "strips a start marker at offset 0, so the marker lands in reasoning_content"),
    DiffClass("stray-start-marker", MODES, "think", repair_stray_start, "genfleet",
              "a start marker anywhere but the beginning: SGLang non-stream (reasoning not forced) "
              "opens reasoning from the start of the text; SGLang stream deletes the first one it "
              "sees, in reasoning or in content, or switches to reasoning there"),
    DiffClass("tool-call-then-end-marker", MODES, "think", repair_tool_then_end, "genfleet",
              "a tool-call marker inside reasoning followed later by an end marker: SGLang non-stream "
              "splits at the end marker (the tool call lands in reasoning_content); its stream "
              "splits at whichever it sees first in a chunk"),
    DiffClass("harmony-no-channel-markers", MODES, "harmony", repair_no_channel_markers, "genfleet",
              "gpt-oss text without <|channel|>/<|start|>: SGLang holds it all back (nothing "
              "returned) or reads it with its skip_special_tokens fallback (words 'analysis', "
              "'commentary', 'assistantfinal' as channels, stripped)"),
    DiffClass("harmony-no-channel-markers-yet", ("stream",), "harmony", repair_no_channel_markers_stream, "genfleet",
              "gpt-oss stream whose first chunks hold the word 'analysis'/'commentary' before any "
              "marker: SGLang's HarmonyParser picks its text fallback for the whole response"),
    DiffClass("harmony-held-tail", ("non-stream",), "harmony", repair_held_tail, "genfleet",
              "gpt-oss text whose end SGLang's HarmonyParser keeps in its buffer and never returns: "
              "an unterminated tool call or commentary, a bare header, a partial marker, "
              "everything after a <|start|> that never reaches <|message|>"),
    DiffClass("harmony-held-tail", ("stream",), "harmony", repair_held_tail_stream, "genfleet", ""),
    DiffClass("harmony-channel-terminators", MODES, "harmony", repair_channel_terminators, "genfleet",
              "a message closed by a terminator SGLang does not accept for its channel (final only "
              "ends at <|return|>, analysis and commentary only at <|end|>/<|call|>): SGLang runs the "
              "message on, keeping the marker and what follows in its body"),
    DiffClass("harmony-commentary-filter", MODES, "harmony", repair_commentary_filter, "genfleet",
              "once a tool call was seen (or the text ends in <|call|>), SGLang's HarmonyParser drops "
              "content whose stripped text is a prefix of the word 'commentary', whitespace-only "
              "preamble bodies included"),
    DiffClass("harmony-stray-structural-token", MODES, "harmony", repair_stray_tokens, "genfleet",
              "a Harmony structural token outside any message: SGLang drops it, genfleet keeps it in "
              "the content (a terminator there is dropped by both)"),
    DiffClass("harmony-stream-analysis-tool-call", ("stream",), "harmony", repair_analysis_tool_call, "genfleet",
              "a built-in tool call on the analysis channel (`analysis to=browser.search …<|call|>`): "
              "SGLang's stream sends its arguments as reasoning_content while they arrive (and the "
              "framing as content), its non-stream returns the whole call as content"),
    DiffClass("stream-split-marker", ("stream",), "any", repair_rechunk_tokens, "genfleet",
              "SGLang's stream parser mishandles a marker split across chunks (chunk boundaries "
              "inside a special token); with one token per chunk it agrees"),
    DiffClass("stream-chunk-dependent", ("stream",), "any", repair_one_chunk, "genfleet",
              "SGLang's stream result depends on the chunking even with whole-token chunks; with "
              "the whole text in one chunk it agrees"),
]
CLASS_BY_NAME = {c.name: c for c in CLASSES if c.summary}


def explain(mode: str, parser: str, chunks: Chunks, kwargs) -> list[str]:
    """Classes whose repairs, applied in turn (again and again while one still applies), make both
    sides agree exactly; or [..., "UNEXPLAINED"]."""
    family = "think" if parser in THINK_FORMATS else "harmony" if parser == "gpt-oss" else "none"
    usable = [c for c in CLASSES if mode in c.modes and c.formats in ("any", family)]
    applied: list[str] = []
    for _ in range(12):
        # The first class (in CLASSES order) whose mechanism is present repairs; then start over,
        # so that the specific mechanisms are tried before the catch-all chunking ones.
        for cls in usable:
            repaired = cls.repair(parser, chunks, kwargs)
            if repaired is not None:
                break
        else:
            break
        if cls.name not in applied:
            applied.append(cls.name)
        if repaired == "STOP":
            return applied
        chunks = repaired
        if ours_whole(parser, "".join(chunks), kwargs) == theirs(mode, parser, chunks, kwargs):
            return applied
    return [*applied, "UNEXPLAINED"]


# --- the run ----------------------------------------------------------------------------------------
@dataclass
class Outcome:
    parser: str
    mode: str
    verdict: str
    classes: tuple[str, ...]
    case: Case
    ours: Pair
    sglang: Pair
    # Stream only: SGLang's result differs when parse_stream_end() is not called (an aborted
    # request, or a client driving the parser without the flush).
    flush_matters: bool = False


def run(count: int, seed: int) -> list[Outcome]:
    outcomes = []
    for parser in PARSER_NAMES:
        for case in generate(parser, count, seed):
            whole = ours_whole(parser, case.text, case.kwargs)
            streamed = ours_stream(parser, case.chunks, case.kwargs)
            if streamed != whole:
                raise AssertionError(f"genfleet's stream and whole-text splits disagree: {case!r}")
            for mode in MODES:
                got = theirs(mode, parser, case.chunks, case.kwargs)
                v = verdict(whole, got)
                classes = () if v == "agree" else tuple(explain(mode, parser, case.chunks, case.kwargs))
                flush_matters = False
                if mode == "stream":
                    unflushed = sg.stream(parser, case.chunks, case.kwargs, flush=False)
                    flush_matters = (unflushed.reasoning, unflushed.content) != got
                outcomes.append(Outcome(parser, mode, v, classes, case, whole, got, flush_matters))
    return outcomes


def agreement_table(outcomes: list[Outcome]) -> str:
    counts: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for o in outcomes:
        counts[(o.parser, o.mode)][o.verdict] += 1
    lines = ["| parser | mode | texts | agree | agree-modulo-whitespace | differ |",
             "|---|---|---:|---:|---:|---:|"]
    for parser in PARSER_NAMES:
        for mode in MODES:
            c = counts[(parser, mode)]
            lines.append(f"| {parser} | {mode} | {sum(c.values())} | {c['agree']} | {c['agree-ws']} | {c['differ']} |")
    return "\n".join(lines)


def class_table(outcomes: list[Outcome]) -> str:
    counts: dict[tuple, Counter] = defaultdict(Counter)
    for o in outcomes:
        if o.verdict != "agree":
            counts[(o.parser, o.mode, " + ".join(o.classes), o.verdict)][o.case.family] += 1
    lines = ["| parser | mode | classes (repairs applied in turn) | verdict | shaped | soup |",
             "|---|---|---|---|---:|---:|"]
    for (parser, mode, classes, v), n in sorted(counts.items(), key=lambda kv: (PARSER_NAMES.index(kv[0][0]), kv[0][1:])):
        lines.append(f"| {parser} | {mode} | {classes} | {v} | {n['shaped']} | {n['soup']} |")
    return "\n".join(lines)


def flush_table(outcomes: list[Outcome]) -> str:
    lines = ["| parser | streamed texts | result changed by parse_stream_end() | of which genfleet agrees with the flushed one |",
             "|---|---:|---:|---:|"]
    for parser in PARSER_NAMES:
        streamed = [o for o in outcomes if o.parser == parser and o.mode == "stream"]
        changed = [o for o in streamed if o.flush_matters]
        lines.append(f"| {parser} | {len(streamed)} | {len(changed)} | {sum(o.verdict == 'agree' for o in changed)} |")
    return "\n".join(lines)


def examples(outcomes: list[Outcome]) -> str:
    """The shortest case of each single class, per mode."""
    best: dict[tuple[str, str], Outcome] = {}
    for o in outcomes:
        if len(o.classes) != 1:
            continue
        key = (o.classes[0], o.mode)
        rank = (o.case.family != "shaped", len(o.case.text))  # a realistic one first, then the shortest
        if key not in best or rank < (best[key].case.family != "shaped", len(best[key].case.text)):
            best[key] = o
    out = []
    for (name, mode), o in sorted(best.items()):
        out.append(f"- **{name}** ({mode}, `{o.parser}`, chat_template_kwargs={o.case.kwargs}):"
                   f" text `{o.case.text!r}`" + (f", chunks `{o.case.chunks!r}`" if mode == "stream" else "")
                   + f"\n  genfleet {o.ours!r}; SGLang {o.sglang!r}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=4000, help="generated texts per parser")
    ap.add_argument("--seed", type=int, default=20250523)
    ap.add_argument("--out", type=Path, default=HERE / "results.md")
    args = ap.parse_args(argv)

    import sglang

    missing = [p for p in PARSER_NAMES if p != "none" and p not in sg.REASONING_PARSER_NAMES]
    if missing:
        print(f"SGLang {sglang.__version__} has no parser named {missing}", file=sys.stderr)
        return 1
    began = time.monotonic()
    outcomes = run(args.cases, args.seed)
    took = time.monotonic() - began
    unexplained = [o for o in outcomes if "UNEXPLAINED" in o.classes]
    report = "\n\n".join([
        f"# genfleet vs SGLang {sglang.__version__}: reasoning split agreement",
        f"Generated by `make oracle` (`oracle/compare.py --cases {args.cases} --seed {args.seed}`). "
        "`agree`: identical strings; `agree-modulo-whitespace`: identical after "
        "`.strip()` of reasoning and content; `differ`: anything else. What each class means, and "
        "which side is right: docs/reasoning-formats.md.",
        "## Agreement", agreement_table(outcomes),
        "## Every non-identical result, by difference class", class_table(outcomes),
        "## The classes (right side: docs/reasoning-formats.md)",
        "\n".join(f"- **{c.name}** ({', '.join(m for m in MODES if any(m in d.modes for d in CLASSES if d.name == c.name))}; "
                  f"right: {c.right}): {c.summary}" for c in CLASS_BY_NAME.values()),
        "## SGLang's end-of-stream flush",
        "The server calls `parse_stream_end()` with the chunk that carries a finish_reason (not on "
        "abort). Streamed texts whose SGLang result would differ without it:",
        flush_table(outcomes),
        "## Shortest example of each class (a shaped text where there is one)", examples(outcomes),
    ]) + "\n"
    args.out.write_text(report)
    print(report)
    print(f"{len(outcomes)} comparisons in {took:.0f} s; written to {args.out}")
    if unexplained:
        print(f"{len(unexplained)} results not explained by a known class, e.g.:", file=sys.stderr)
        for o in unexplained[:10]:
            print(f"  {o.parser} {o.mode} kwargs={o.case.kwargs} text={o.case.text!r} chunks={o.case.chunks!r}\n"
                  f"    genfleet={o.ours!r}\n    sglang  ={o.sglang!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
