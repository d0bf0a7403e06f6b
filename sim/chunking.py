"""Decode steps and the stream's chunk cadence: at which generated-token counts a chunk goes out.

SGLang 0.5.23 `managers/scheduler_components/output_streamer.py` (`_GenerationStreamAccumulator.
accept`) decides per scheduler step whether a streaming request's new tokens are sent:

    num_unsent = len(req.output_ids) - req.send_token_offset
    should_output = (stream_interval == 1 or num_unsent >= stream_interval
                     or (req.send_token_offset == 0 and num_unsent > 0))

and a finished request always gets its (final) chunk. So the first token (prefill's) goes out
alone, then a chunk whenever at least `stream_interval` tokens are unsent after a step. A step
appends one token in plain decoding but several under speculative decoding ("a step can append
several tokens (speculative decoding, dLLM), so it can pass a multiple of the interval without
landing on it", same file), so a chunk may carry more than `stream_interval` tokens. A step that
reaches the stop token ends the request there (`Req.output_ids_through_stop`,
`managers/schedule_batch.py`): the last step is cut at the end, and its tokens go out in the
final chunk, with whatever else was unsent.

Everything here is a pure function of its arguments, so a test predicts a stream's chunks exactly.
"""
from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

# Mixed into the completion seed so step sizes do not replay the completion's word draws.
_STEP_SEED_SALT = 0x5E_5EED_C4A7_57E9


@dataclass(frozen=True)
class DecodeSteps:
    """How many tokens each decode step appends: uniform over [low, high], drawn per step.

    (1, 1) is plain decoding (the default), (N, N) `--tokens-per-step N`, and (1, MAX)
    `--spec-tokens MAX`: speculative decoding, where a verify step accepts 1..MAX tokens (the
    accepted drafts plus the bonus token). Draws come from an RNG seeded by the request's
    completion seed (`CompletionPlan.rng_seed`), so a prompt and seed always stream alike.
    """

    low: int = 1
    high: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.high:
            raise ValueError(f"decode steps need 1 <= low <= high, got {self.low}..{self.high}")

    @property
    def fixed(self) -> bool:
        return self.low == self.high

    def describe(self) -> str:
        return f"{self.low} token(s)/step" if self.fixed else f"{self.low}..{self.high} tokens/step"

    def boundaries(self, rng_seed: int) -> Iterator[int]:
        """Generated-token counts after each step, without end: 1 (prefill's token), then one step
        more each time."""
        if self.fixed:
            yield from itertools.count(1, self.low)
            return
        rand = random.Random(rng_seed ^ _STEP_SEED_SALT).random
        low, span, count = self.low, self.high - self.low + 1, 1
        while True:
            yield count
            count += low + int(rand() * span)

    def chunk_counts(self, limit: int, stream_interval: int, rng_seed: int) -> Iterator[int]:
        """The counts below `limit` at which a streaming request gets a (non-final) chunk."""
        interval = max(1, stream_interval)
        if self.fixed:
            # Chunks land on step boundaries 1 + k*N; from one, the next is the first boundary at
            # least `interval` further on: ceil(interval / N) steps.
            step = self.low
            return iter(range(1, limit, step * -(-interval // step)))
        return _chunk_counts(self.boundaries(rng_seed), limit, interval)

    def stream_counts(self, total: int, stream_interval: int, rng_seed: int) -> list[int]:
        """Every chunk of a stream that ends at `total` tokens, as the completion_tokens each one
        reports: the non-final chunks, then the final one (which carries whatever is left)."""
        return [*self.chunk_counts(total, stream_interval, rng_seed), total]


def _chunk_counts(boundaries: Iterable[int], limit: int, interval: int) -> Iterator[int]:
    sent = 0
    for count in boundaries:
        if count >= limit:
            return
        # SGLang's test, with the first token as the `send_token_offset == 0` case.
        if interval == 1 or count - sent >= interval or sent == 0:
            yield count
            sent = count


def chunk_sizes(counts: list[int]) -> list[int]:
    """The tokens each chunk carries, from the counts the chunks report."""
    return [b - a for a, b in zip([0, *counts[:-1]], counts, strict=True)]
