"""Runs the generated cases through both sides: one `Outcome` per case, parser and mode."""
from __future__ import annotations

from dataclasses import dataclass

import sglang_side as sg
from cases import Case, generate
from difference_classes import explain
from sides import MODES, Pair, ours_stream, ours_whole, theirs, verdict

from genfleet.common.reasoning import PARSER_NAMES


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


def run_cases(count: int, seed: int) -> list[Outcome]:
    """`count` generated cases per parser, each split by both sides in both modes."""
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
