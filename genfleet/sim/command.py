"""`genfleet sim`: every option, parsed into `SimSettings`.

The simulator's options for loops, disconnects, prefill and the prefix cache (declared here to
keep `sim.cli` short), and the parsing of `LO:HI` ranges.

`genfleet sim` / `python -m genfleet.sim`: command-line flags into SimSettings, then serve.
"""
from __future__ import annotations

import enum
import functools
import os
from pathlib import Path
from typing import Annotated, TypeVar

import typer

from genfleet.sim.capacity import (
    CLIP_MAX_NEW_TOKENS,
    DEFAULT_MAX_PREFILL_TOKENS,
    DEFAULT_PAGE_SIZE,
    DEFAULT_PREFIX_CACHE_TOKENS,
    INIT_NEW_TOKEN_RATIO,
    MIN_NEW_TOKEN_RATIO_FACTOR,
    NEW_TOKEN_RATIO_DECAY_STEPS,
    CapacitySettings,
)
from genfleet.sim.completion import DEFAULT_REASONING_FORMAT, NO_LOOPS, REASONING_FORMAT_NAMES, LengthModel, LoopModel
from genfleet.sim.engine import DecodeSteps
from genfleet.sim.faults import ErrorFormat, FaultSettings
from genfleet.sim.settings import DEFAULT_CONTEXT_LENGTH, DEFAULT_DISCONNECT_ABORT_S, SimSettings
from genfleet.sim.vocab import DEFAULT_TOKENIZER_DIR

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


Number = TypeVar("Number", int, float)


def _sglang_variable(name: str, default: Number) -> Number:
    """One of SGLang's own environment variables (`environ.py`), as a number of `default`'s type."""
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return type(default)(value)
    except ValueError:
        raise typer.BadParameter(f"{name}={value!r} is not {type(default).__name__}") from None


_CAPACITY = "Capacity"
_OUTPUT = "Output"
_FAULTS = "Faults"

# typer offers an Enum's values as the choices; SGLang's names are not all identifiers.
ReasoningFormatName = enum.Enum(  # type: ignore[misc]
    "ReasoningFormatName", {name.replace("-", "_"): name for name in REASONING_FORMAT_NAMES}, type=str
)
_DEFAULT_REASONING_FORMAT = ReasoningFormatName(DEFAULT_REASONING_FORMAT)


def sim_settings(
    port: Annotated[int, typer.Option(help="Port to listen on.")],
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    tokenizer: Annotated[
        Path, typer.Option(help="Tokenizer directory (tokenizer.json); also reported as the model path.")
    ] = DEFAULT_TOKENIZER_DIR,
    # -- capacity
    rate: Annotated[
        float,
        typer.Option(min=0.001, help="Decode tokens/s of a lone request, between prefill batches.",
                     rich_help_panel=_CAPACITY),
    ] = 100.0,
    knee: Annotated[
        float,
        typer.Option(
            min=0.001,
            help="Running count at which per-request speed halves: rate / (1 + running / knee).",
            rich_help_panel=_CAPACITY,
        ),
    ] = 64.0,
    prefill_rate: PrefillRate = 50_000.0,
    max_prefill_tokens: MaxPrefillTokens = DEFAULT_MAX_PREFILL_TOKENS,
    max_running: Annotated[
        int | None,
        typer.Option(
            min=1, help="Most requests running at once; the rest wait (unlimited if unset).", rich_help_panel=_CAPACITY
        ),
    ] = None,
    max_total_tokens: Annotated[
        int | None,
        typer.Option(
            min=1, help="KV cache tokens, like SGLang's --max-total-tokens: a request waits until its prompt plus "
            "min(max_new_tokens, 4096) fits beside what the running ones hold and reserve (their prompts, what "
            "they decoded, and --new-token-ratio of the rest of their caps). Unset: no KV limit.",
            rich_help_panel=_CAPACITY,
        ),
    ] = None,
    new_token_ratio: Annotated[
        float,
        typer.Option(
            min=0.0, max=1.0, help="Share of a running request's remaining cap the KV cache keeps for it, at the "
            "start and whenever the server is idle; it decays each decode step as SGLang's does (to 0.14 of it in "
            "600 steps: SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR, SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS).",
            rich_help_panel=_CAPACITY,
        ),
    ] = INIT_NEW_TOKEN_RATIO,
    tick: Annotated[
        float,
        typer.Option(
            min=0.001, help="Shortest sleep of a stream between writes, in seconds.", rich_help_panel=_CAPACITY
        ),
    ] = 0.02,
    disconnect_abort_s: DisconnectAbortS = DEFAULT_DISCONNECT_ABORT_S,
    prefix_cache_tokens: PrefixCacheTokens = DEFAULT_PREFIX_CACHE_TOKENS,
    page_size: PageSize = DEFAULT_PAGE_SIZE,
    enable_cache_report: EnableCacheReport = False,
    weight_version: WeightVersion = "default",
    # -- output
    length_median: Annotated[
        float, typer.Option(min=1.0, help="Median completion length in words (lognormal).", rich_help_panel=_OUTPUT)
    ] = 646.0,
    length_mean: Annotated[
        float, typer.Option(min=1.0, help="Mean completion length in words (lognormal).", rich_help_panel=_OUTPUT)
    ] = 1416.0,
    length_scale: Annotated[
        float, typer.Option(min=0.0, help="Multiplies every completion length.", rich_help_panel=_OUTPUT)
    ] = 1.0,
    length_tokens: Annotated[
        str | None,
        typer.Option(
            metavar="LO:HI",
            help="Make each completion exactly N tokens long (markers and the stop token included: its "
            "completion_tokens when it stops), N uniform over [LO, HI] and a function of the prompt and seed "
            "(sim.settings.SimSettings.plan predicts it). Replaces --length-median/--length-mean/--length-scale.",
            rich_help_panel=_OUTPUT,
        ),
    ] = None,
    reasoning_share: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Share of the words that are reasoning (0: empty reasoning).",
                           rich_help_panel=_OUTPUT)
    ] = 0.7,
    loop_rate: LoopRate = NO_LOOPS.rate,
    loop_period: LoopPeriod = DEFAULT_LOOP_PERIOD,
    loop_start: LoopStart = DEFAULT_LOOP_START,
    stream_interval: Annotated[
        int,
        typer.Option(
            min=1,
            help="Tokens per stream chunk unless the request sets sampling_params.stream_interval.",
            rich_help_panel=_OUTPUT,
        ),
    ] = 1,
    tokens_per_step: Annotated[
        int,
        typer.Option(
            min=1,
            help="Tokens each decode step appends (after the prefill's first token), so a chunk may carry "
            "more than the stream interval, as under speculative decoding.",
            rich_help_panel=_OUTPUT,
        ),
    ] = 1,
    spec_tokens: Annotated[
        int | None,
        typer.Option(
            min=1,
            metavar="MAX",
            help="Speculative decoding: each decode step appends 1..MAX tokens, uniform, drawn from the "
            "request's completion seed (so a prompt and seed always stream alike). Excludes --tokens-per-step.",
            rich_help_panel=_OUTPUT,
        ),
    ] = None,
    incremental: Annotated[
        bool,
        typer.Option(
            "--incremental",
            help="Stream deltas, like --incremental-streaming-output (default: cumulative).",
            rich_help_panel=_OUTPUT,
        ),
    ] = False,
    seed: Annotated[
        int, typer.Option(help="Completion seed when a request sets no sampling_seed.", rich_help_panel=_OUTPUT)
    ] = 0,
    context_length: Annotated[
        int, typer.Option(min=1, help="Longest prompt in tokens, exclusive.", rich_help_panel=_OUTPUT)
    ] = DEFAULT_CONTEXT_LENGTH,
    no_server_info: Annotated[
        bool,
        typer.Option(
            "--no-server-info",
            help="Answer 404 at /server_info and /get_server_info, like a router that does not pass them on: "
            "clients must infer the streaming mode from the chunks.",
            rich_help_panel=_OUTPUT,
        ),
    ] = False,
    no_loads: Annotated[
        bool,
        typer.Option(
            "--no-loads",
            help="Answer 404 at /v1/loads, like an older SGLang or a router: `--in-flight auto` workers stay fixed.",
            rich_help_panel=_OUTPUT,
        ),
    ] = False,
    log_completions: Annotated[
        Path | None,
        typer.Option(
            metavar="PATH",
            help="Append one JSON line per request whose response went out whole (format: sim/server.py).",
            rich_help_panel=_OUTPUT,
        ),
    ] = None,
    reasoning_format: Annotated[
        ReasoningFormatName,
        typer.Option(
            help="Which reasoning parser's markers the model writes (SGLang's --reasoning-parser names); "
            "also the parser /v1/chat/completions splits with.",
            rich_help_panel=_OUTPUT,
        ),
    ] = _DEFAULT_REASONING_FORMAT,
    # -- faults
    http_500_rate: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Share of requests answered HTTP 500.", rich_help_panel=_FAULTS)
    ] = 0.0,
    abort_rate: Annotated[
        float,
        typer.Option(
            min=0.0, max=1.0, help="Share of requests aborted with 503 'The request queue is full.'",
            rich_help_panel=_FAULTS,
        ),
    ] = 0.0,
    error_chunk_rate: Annotated[
        float,
        typer.Option(
            min=0.0, max=1.0, help="Share of requests cut by a CUDA error chunk mid-stream.", rich_help_panel=_FAULTS
        ),
    ] = 0.0,
    stall_rate: Annotated[
        float,
        typer.Option(
            min=0.0, max=1.0, help="Share of requests that go silent mid-stream, forever.", rich_help_panel=_FAULTS
        ),
    ] = 0.0,
    drop_chunk_rate: Annotated[
        float,
        typer.Option(
            min=0.0, max=1.0,
            help="Share of streams that silently lose one non-final chunk (streams with fewer than two are "
            "left alone). On top of the other faults.",
            rich_help_panel=_FAULTS,
        ),
    ] = 0.0,
    miscount_rate: Annotated[
        float,
        typer.Option(
            min=0.0, max=1.0,
            help="Share of requests whose final completion_tokens (meta_info, or the chat usage) is one too many. "
            "On top of the other faults.",
            rich_help_panel=_FAULTS,
        ),
    ] = 0.0,
    fault_seed: Annotated[
        int, typer.Option(help="Seed of the per-request fault draws.", rich_help_panel=_FAULTS)
    ] = 0,
    die_after: Annotated[
        float | None,
        typer.Option(min=0.0, help="Exit abruptly (os._exit) this many seconds after start.", rich_help_panel=_FAULTS),
    ] = None,
    error_format: Annotated[
        ErrorFormat, typer.Option(help="Which SGLang release's error chunks to send.", rich_help_panel=_FAULTS)
    ] = ErrorFormat.V0_5_23,
) -> SimSettings:
    """Run a simulated SGLang server (0.5.23 /generate and /v1/chat/completions wire formats) with a
    capacity model and faults."""
    if spec_tokens is not None and tokens_per_step != 1:
        raise typer.BadParameter("give --tokens-per-step or --spec-tokens, not both", param_hint="--spec-tokens")
    steps = DecodeSteps(1, spec_tokens) if spec_tokens is not None else DecodeSteps(tokens_per_step, tokens_per_step)
    return (
        SimSettings(
            port=port,
            host=host,
            tokenizer_dir=tokenizer,
            capacity=CapacitySettings(rate=rate, knee=knee, prefill_rate=prefill_rate,
                                      max_prefill_tokens=max_prefill_tokens, max_running=max_running,
                                      max_total_tokens=max_total_tokens, new_token_ratio=new_token_ratio,
                                      # SGLang's own variables, read as SGLang 0.5.23 reads them (environ.py).
                                      clip_max_new_tokens=_sglang_variable(
                                          "SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION", CLIP_MAX_NEW_TOKENS),
                                      min_new_token_ratio_factor=_sglang_variable(
                                          "SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR", MIN_NEW_TOKEN_RATIO_FACTOR),
                                      new_token_ratio_decay_steps=_sglang_variable(
                                          "SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS", NEW_TOKEN_RATIO_DECAY_STEPS),
                                      prefix_cache_tokens=prefix_cache_tokens, page_size=page_size),
            lengths=LengthModel(
                median=length_median,
                mean=length_mean,
                scale=length_scale,
                reasoning_share=reasoning_share,
                tokens=token_range(length_tokens, "--length-tokens"),
            ),
            loops=LoopModel(
                rate=loop_rate,
                period=token_range(loop_period, "--loop-period"),  # type: ignore[arg-type]
                start=token_range(loop_start, "--loop-start", minimum=0),  # type: ignore[arg-type]
            ),
            disconnect_abort_s=disconnect_abort_s,
            enable_cache_report=enable_cache_report,
            weight_version=weight_version,
            stream_interval=stream_interval,
            incremental=incremental,
            seed=seed,
            context_length=context_length,
            reasoning_format=reasoning_format.value,
            tick=tick,
            faults=FaultSettings(
                http_500_rate=http_500_rate,
                abort_rate=abort_rate,
                error_chunk_rate=error_chunk_rate,
                stall_rate=stall_rate,
                drop_chunk_rate=drop_chunk_rate,
                miscount_rate=miscount_rate,
                die_after=die_after,
                seed=fault_seed,
                error_format=error_format,
            ),
            steps=steps,
            server_info=not no_server_info,
            loads=not no_loads,
            log_completions=log_completions,
        )
    )


@functools.wraps(sim_settings)  # the same options (typer reads the wrapped signature)
def sim_command(*args: object, **kwargs: object) -> None:
    from genfleet.sim.server import serve  # uvicorn and starlette load only when serving

    serve(sim_settings(*args, **kwargs))  # type: ignore[arg-type]
