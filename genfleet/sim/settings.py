"""Everything a simulated server is configured with, as one typed object, and the pure functions
that predict what it serves: `plan` (a prompt's completion), `plan_cut_continuation` (what a request
continuing a cut completion gets: the continuation of `plan`) and `stream_counts` (its chunks)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from genfleet.sim.capacity import CapacitySettings
from genfleet.sim.completion import (
    DEFAULT_REASONING_FORMAT,
    NO_LOOPS,
    CompletionPlan,
    Cut,
    LengthModel,
    LoopModel,
    continuation_tail,
    plan_completion,
    plan_seeded,
)
from genfleet.sim.engine import DecodeSteps
from genfleet.sim.faults import FaultSettings
from genfleet.sim.requests import DEFAULT_MAX_NEW_TOKENS
from genfleet.sim.vocab import DEFAULT_TOKENIZER_DIR, SimVocab

DEFAULT_CONTEXT_LENGTH = 32768
# `create_abort_task` sleeps 2 s before aborting a stream whose client left (sglang 0.5.23
# `managers/tokenizer_manager.py`).
DEFAULT_DISCONNECT_ABORT_S = 2.0


@dataclass(frozen=True)
class SimSettings:
    port: int
    host: str = "127.0.0.1"
    tokenizer_dir: Path = DEFAULT_TOKENIZER_DIR
    capacity: CapacitySettings = field(default_factory=CapacitySettings)
    lengths: LengthModel = field(default_factory=LengthModel)
    stream_interval: int = 1  # SGLang's --stream-interval default
    incremental: bool = False  # SGLang's --incremental-streaming-output
    seed: int = 0
    context_length: int = DEFAULT_CONTEXT_LENGTH
    tick: float = 0.02
    faults: FaultSettings = field(default_factory=FaultSettings)
    reasoning_format: str = DEFAULT_REASONING_FORMAT  # an SGLang --reasoning-parser name
    steps: DecodeSteps = field(default_factory=DecodeSteps)  # tokens per decode step
    server_info: bool = True  # False: /server_info and /get_server_info answer 404
    loads: bool = True  # False: /v1/loads answers 404, as before SGLang had it, or behind a router
    log_completions: Path | None = None  # a JSON line per served request (sim.server)
    loops: LoopModel = NO_LOOPS  # completions that repeat until max_new_tokens (sim.completion)
    disconnect_abort_s: float = DEFAULT_DISCONNECT_ABORT_S  # a left stream decodes on this long (sim.engine)
    enable_cache_report: bool = False  # SGLang's --enable-cache-report: chat usage's prompt_tokens_details
    weight_version: str = "default"  # SGLang's --weight-version, which a server keeps until a weight update

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- predictions: what the server does with a request, without a server ---------------------

    def plan(
        self,
        prompt: Sequence[int] | str,
        *,
        vocab: SimVocab,
        seed: int | None = None,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    ) -> CompletionPlan:
        """The completion the server plans for `prompt`: `seed` is the request's sampling_seed
        (chat: `seed`), None for the server's --seed; `max_new_tokens` as the request set it (for
        a chat request, `chat_max_new_tokens`)."""
        return plan_completion(
            prompt,
            seed=self.seed if seed is None else seed,
            max_new_tokens=max_new_tokens,
            lengths=self.lengths,
            vocab=vocab,
            reasoning_format=self.reasoning_format,
            loops=self.loops,
        )

    def plan_cut_continuation(self, cut: Cut, *, vocab: SimVocab, max_new_tokens: int) -> CompletionPlan:
        """The continuation of `plan` for a cut the server remembers (by seed, not by prompt): what
        follows the cut's first `cut.generated` output ids, `max_new_tokens` the continuation's."""
        whole = plan_seeded(
            cut.rng_seed, cut.opening, max_new_tokens=cut.generated + max_new_tokens, lengths=self.lengths,
            vocab=vocab, reasoning_format=self.reasoning_format, loops=self.loops,
        )
        return continuation_tail(whole, cut.generated, max_new_tokens)

    def chat_max_new_tokens(self, prompt_tokens: int, max_tokens: int | None) -> int:
        """A chat request's budget: its max_(completion_)tokens, else up to the context length."""
        return self.context_length - prompt_tokens if max_tokens is None else max_tokens

    def effective_stream_interval(self, requested: int | None) -> int:
        """sampling_params.stream_interval, else --stream-interval (sglang 0.5.23
        `output_streamer.py`: `req.sampling_params.stream_interval or self.default_stream_interval`)."""
        return max(1, requested or self.stream_interval)

    def stream_counts(self, plan: CompletionPlan, *, stream_interval: int | None = None) -> list[int]:
        """The completion_tokens of each chunk of the plan's stream (no faults), the final one
        last: the chunk cadence for this request's interval and decode steps."""
        interval = self.effective_stream_interval(stream_interval)
        return self.steps.stream_counts(plan.completion_tokens, interval, plan.rng_seed)

    def describe(self) -> str:
        capacity, lengths = self.capacity, self.lengths
        running = f", max running {capacity.max_running}" if capacity.max_running is not None else ""
        cache = (f"prefix cache {capacity.prefix_cache_tokens} tokens in pages of {capacity.page_size}"
                 if capacity.prefix_cache_tokens else "no prefix cache")
        length = (
            f"length {lengths.tokens[0]}..{lengths.tokens[1]} tokens" if lengths.tokens is not None
            else f"length median {lengths.median:g} mean {lengths.mean:g} x{lengths.scale:g}"
        )
        return (
            f"rate {capacity.rate:g} tok/s, knee {capacity.knee:g}{running}, prefill {capacity.prefill_rate:g} "
            f"tok/s in batches of {capacity.max_prefill_tokens}, {cache}, {length}, "
            f"{'incremental' if self.incremental else 'cumulative'} stream every {self.stream_interval}, "
            f"{self.steps.describe()}, reasoning {self.reasoning_format}, seed {self.seed}, "
            f"context {self.context_length}, {self.loops.describe()}, "
            f"disconnect abort after {self.disconnect_abort_s:g}s, faults: {self.faults.describe()}"
            + ("" if self.server_info else ", no /server_info") + ("" if self.loads else ", no /v1/loads")
            + (", cache report" if self.enable_cache_report else "")
            + (f", logging completions to {self.log_completions}" if self.log_completions else "")
        )
