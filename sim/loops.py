"""`--loop-rate`: completions that fall into a repetition loop and never stop.

A looping completion is the ordinary completion of its prompt and seed up to `loop_start` output
ids, then `loop_period` fresh words repeated, again and again, until max_new_tokens: it finishes
with `{"type": "length", "length": max_new_tokens}` and never writes its stop token. The period is
drawn fresh (not copied from the ids before it), so that it never holds a marker: a loop that
begins inside the reasoning never closes it, one that begins in the content stays content.

Whether a completion loops, where and with which period comes from its own RNG, seeded from the
completion seed but apart from the one that draws the completion's length and words: every
completion that does not loop is the same, id for id, whatever `--loop-rate` says, and raising
the rate only adds loops (a prompt's draw is the same at any rate). The loop is a property of the
prompt and seed, not of the budget, so a smaller max_new_tokens still yields a prefix of the same
completion, and a continuation (sim.continuation) keeps looping.

A drawn start that falls inside a marker (halfway through a Harmony header, say) moves past it:
into the reasoning after its open marker, into the content after its close and content-open
markers; one at the very start of the close marker stays there, and that loop never closes the
reasoning. A completion shorter than the drawn start loops from where its stop token would have
been (and one shorter than its markers, from the start of the marker it was cut in).
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import cycle, islice

# Mixed into the completion seed: the loop's draws must not replay the completion's own.
_LOOP_SEED_SALT = 0x100B_5EED_0F_1009


@dataclass(frozen=True)
class LoopModel:
    """How often completions loop (0..1), and the ranges of their period and start, in tokens."""

    rate: float = 0.0
    period: tuple[int, int] = (5, 40)
    start: tuple[int, int] = (16, 400)

    def __post_init__(self) -> None:
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"loop rate must be within 0..1, got {self.rate}")
        if not 1 <= self.period[0] <= self.period[1]:
            raise ValueError(f"loop period needs 1 <= LO <= HI, got {self.period[0]}:{self.period[1]}")
        if not 0 <= self.start[0] <= self.start[1]:
            raise ValueError(f"loop start needs 0 <= LO <= HI, got {self.start[0]}:{self.start[1]}")

    def describe(self) -> str:
        if self.rate <= 0:
            return "no loops"
        return (f"loops {self.rate:g} (period {self.period[0]}..{self.period[1]}, "
                f"start {self.start[0]}..{self.start[1]})")


NO_LOOPS = LoopModel()


@dataclass(frozen=True)
class Loop:
    """One completion's loop: where it would start (before moving it off markers) and its words."""

    drawn_start: int
    period_ids: tuple[int, ...]


def draw_loop(model: LoopModel, rng_seed: int, word_ids: Sequence[int]) -> Loop | None:
    """The loop of the completion with this seed, or None if it does not loop."""
    if model.rate <= 0:
        return None  # no RNG at all: the default costs nothing
    rng = random.Random(rng_seed ^ _LOOP_SEED_SALT)
    # Always the same draws, whatever the rate: a prompt that loops at one rate loops alike at a higher one.
    roll, start, period = rng.random(), rng.randint(*model.start), rng.randint(*model.period)
    if roll >= model.rate:
        return None
    return Loop(start, tuple(rng.choices(word_ids, k=period)))


def place_loop(drawn_start: int, marker_runs: Sequence[tuple[int, int]], natural_length: int) -> int:
    """Where the loop starts: `drawn_start` moved past a marker it falls inside, but no later than
    the completion's natural end (where its stop token would be), and never inside a marker
    (a completion cut shorter than its markers loops from the marker's start)."""
    start = drawn_start
    for low, high in marker_runs:
        if low < start < high:
            start = high
    start = min(start, natural_length)
    for low, high in marker_runs:
        if low < start < high:
            start = low
    return start


def extend_with_loop(ids: list[int], period_ids: Sequence[int], max_new_tokens: int) -> None:
    """Repeat the period after `ids` up to exactly max_new_tokens ids."""
    ids.extend(islice(cycle(period_ids), max(0, max_new_tokens - len(ids))))
