"""The simulator's options for loops and disconnects (declared here to keep `sim.cli` short), and
the parsing of `LO:HI` ranges."""
from __future__ import annotations

from typing import Annotated

import typer

from sim.loops import NO_LOOPS
from sim.settings import DEFAULT_DISCONNECT_ABORT_S

OUTPUT_PANEL = "Output"
CAPACITY_PANEL = "Capacity"

DEFAULT_LOOP_PERIOD = "{}:{}".format(*NO_LOOPS.period)
DEFAULT_LOOP_START = "{}:{}".format(*NO_LOOPS.start)

LoopRate = Annotated[
    float,
    typer.Option(
        min=0.0, max=1.0,
        help="Share of completions that fall into a loop: from --loop-start on they repeat a period of "
        "--loop-period words until max_new_tokens (finish_reason length, never the stop token). Which ones, "
        "where and how is a function of the prompt and seed (CompletionPlan.loop_start, .loop_period); the "
        "others are unchanged. Also with --length-tokens.",
        rich_help_panel=OUTPUT_PANEL,
    ),
]
LoopPeriod = Annotated[
    str,
    typer.Option(metavar="LO:HI", help="Words in a loop's period, uniform over [LO, HI].",
                 rich_help_panel=OUTPUT_PANEL),
]
LoopStart = Annotated[
    str,
    typer.Option(
        metavar="LO:HI",
        help="Output tokens before a loop begins, uniform over [LO, HI] (moved off marker tokens; a "
        "shorter completion loops where it would have stopped).",
        rich_help_panel=OUTPUT_PANEL,
    ),
]
DisconnectAbortS = Annotated[
    float,
    typer.Option(
        min=0.0,
        help="Seconds a stream whose client left keeps its slot and keeps decoding before it is aborted "
        f"(SGLang's create_abort_task sleeps {DEFAULT_DISCONNECT_ABORT_S:g} s). Non-streaming requests are "
        "aborted as SGLang notices: at their next 50-token output or 4-second poll.",
        rich_help_panel=CAPACITY_PANEL,
    ),
]


def token_range(value: str | None, flag: str, minimum: int = 1) -> tuple[int, int] | None:
    """`LO:HI` (or `N`, for N:N) into a checked pair."""
    if value is None:
        return None
    low, _, high = value.partition(":")
    try:
        bounds = (int(low), int(high or low))
    except ValueError:
        raise typer.BadParameter(f"expected LO:HI (two integers), got {value!r}", param_hint=flag) from None
    if not minimum <= bounds[0] <= bounds[1]:
        raise typer.BadParameter(f"need {minimum} <= LO <= HI, got {value!r}", param_hint=flag)
    return bounds
