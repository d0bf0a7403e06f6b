"""The simulator's options for loops, disconnects, prefill and the prefix cache (declared here to
keep `sim.cli` short), and the parsing of `LO:HI` ranges."""
from __future__ import annotations

from typing import Annotated

import typer

from genfleet.sim.loops import NO_LOOPS
from genfleet.sim.prefix_cache import DEFAULT_PAGE_SIZE, DEFAULT_PREFIX_CACHE_TOKENS
from genfleet.sim.settings import DEFAULT_DISCONNECT_ABORT_S

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

PrefillRate = Annotated[
    float,
    typer.Option(
        min=0.001,
        help="Prompt tokens/s of the server's prefill. Requests are prefilled in batches, one at a time "
        "(FCFS, up to --max-prefill-tokens uncached tokens), each taking its uncached tokens / this rate; "
        "while a batch runs no request decodes, as in SGLang without --enable-mixed-chunk.",
        rich_help_panel=CAPACITY_PANEL,
    ),
]
MaxPrefillTokens = Annotated[
    int,
    typer.Option(
        min=1,
        help="Uncached prompt tokens in one prefill batch, like SGLang's --max-prefill-tokens: a batch takes "
        "waiting requests in order and ends at the first that would reach it (the first always goes). "
        "SGLang's chunked prefill (8192 tokens on an H200) is not modelled: give 8192 to bound batches alike.",
        rich_help_panel=CAPACITY_PANEL,
    ),
]
PrefixCacheTokens = Annotated[
    int,
    typer.Option(
        min=0,
        help="Tokens of SGLang's radix prefix cache on this host (0: none). A request's cached prefix "
        "(meta_info cached_tokens), matched as its prefill batch forms, is not prefilled again: the batch "
        "takes its uncached tokens / --prefill-rate. Prompts are cached as their batch ends (two requests "
        "with one prompt in one batch both miss), prompt + output as requests end; least recently used "
        f"leaves are evicted. Default {DEFAULT_PREFIX_CACHE_TOKENS:,} (a big GPU's KV pool).",
        rich_help_panel=CAPACITY_PANEL,
    ),
]
PageSize = Annotated[
    int,
    typer.Option(
        min=1,
        help="Tokens per page of the prefix cache, which caches and matches whole pages, like SGLang's "
        f"--page-size (whose default is 1; {DEFAULT_PAGE_SIZE} keeps the sim's lookups cheap).",
        rich_help_panel=CAPACITY_PANEL,
    ),
]
EnableCacheReport = Annotated[
    bool,
    typer.Option(
        "--enable-cache-report",
        help="Report the cached prompt tokens in the chat API's usage (prompt_tokens_details), like SGLang's "
        "--enable-cache-report (/generate's meta_info always has cached_tokens).",
        rich_help_panel=OUTPUT_PANEL,
    ),
]

WeightVersion = Annotated[
    str,
    typer.Option(
        "--weight-version",
        help="The weight version the server reports (/model_info, /server_info, each meta_info and its "
        "weight_versions spans, the chat API's metadata), like SGLang's --weight-version.",
        rich_help_panel=OUTPUT_PANEL,
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
