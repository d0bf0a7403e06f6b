"""The two sides of the differential test: genfleet's split (whole text and streamed, which must
agree) and SGLang 0.5.23's (non-stream and stream, see sglang_side.py), and the verdict between them."""
from __future__ import annotations

import sglang_side as sg

from genfleet.common.reasoning import ReasoningStream, split_reasoning

MODES = ("non-stream", "stream")
Pair = tuple[str, str]


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
