"""The known difference classes between genfleet's split and SGLang's (docs/reasoning-formats.md),
and `explain`, which finds the classes whose repairs make a result agree."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cases import THINK_FORMATS
from repairs import (
    STOP,
    Chunks,
    repair_analysis_tool_call,
    repair_channel_terminators,
    repair_commentary_filter,
    repair_held_tail,
    repair_held_tail_stream,
    repair_no_channel_markers,
    repair_no_channel_markers_stream,
    repair_one_chunk,
    repair_rechunk_tokens,
    repair_stray_start,
    repair_stray_tokens,
    repair_tool_then_end,
    repair_ws_before_start,
)
from sides import MODES, ours_whole, theirs


@dataclass(frozen=True)
class DiffClass:
    name: str
    modes: tuple[str, ...]
    # "think" (the <think>/◁think▷ formats), "harmony" (gpt-oss) or "any".
    formats: str
    # Returns the repaired chunks, None when the mechanism is not present in this case, or STOP
    # when it is present and cannot be repaired (see repairs.py).
    repair: Callable[[str, Chunks, dict | None], Chunks | str | None]
    # Which side the reference page says is right.
    right: str
    summary: str


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
        if repaired == STOP:
            return applied
        chunks = repaired
        if ours_whole(parser, "".join(chunks), kwargs) == theirs(mode, parser, chunks, kwargs):
            return applied
    return [*applied, "UNEXPLAINED"]
