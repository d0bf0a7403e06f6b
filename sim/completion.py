"""Deterministic completions: the token ids a simulated reasoning model returns for a prompt and seed."""
from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from genfleet.sim.lengths import LengthModel
from genfleet.sim.loops import NO_LOOPS, LoopModel, draw_loop, extend_with_loop, place_loop
from genfleet.sim.prompts import Opening, completion_seed, prompt_opening
from genfleet.sim.reasoning_formats import DEFAULT_REASONING_FORMAT, ReasoningFormat
from genfleet.sim.reasoning_formats import reasoning_format as get_reasoning_format
from genfleet.sim.vocab import SimVocab

__all__ = ["CompletionPlan", "LengthModel", "Opening", "completion_seed", "plan_completion", "plan_seeded",
           "prompt_opening"]


@dataclass(frozen=True)
class CompletionPlan:
    """One completion, as SGLang 0.5.23 reports it.

    A completion that finished by its stop token holds that token as its last output id, and
    `completion_tokens == len(output_ids)` always: the scheduler sends
    `Req.output_ids_through_stop` ("Stop position is included", `managers/schedule_batch.py`) and
    counts `completion_tokens = len(output_ids_)`
    (`managers/scheduler_components/output_streamer.py`). Only the text drops it: the
    detokenizer decodes `ids[:-1]` when `matched` is a token id (`trim_matched_stop`,
    `managers/detokenizer_manager.py`), whatever `skip_special_tokens` says. So the text is
    `output_ids[:text_end]`, decoded.

    `output_ids[reasoning_start:reasoning_end]` are the reasoning words and
    `output_ids[content_start:text_end]` the content words; every other id is a marker (or the stop
    token, at `text_end`).
    """

    output_ids: list[int]
    finish_reason: dict[str, Any]
    completion_tokens: int
    reasoning_tokens: int
    reasoning_text: str
    content_text: str
    reasoning_start: int
    opening: Opening
    reasoning_end: int
    content_start: int
    reasoning_format: str
    vocab: SimVocab = field(repr=False, compare=False)
    # `completion_seed(prompt, seed)`: also seeds the request's decode-step sizes (sim.chunking).
    rng_seed: int = 0
    # A looping completion (sim.loops): its ids from `loop_start` on repeat a period of
    # `loop_period` words up to max_new_tokens (`loop_start` may lie past a small budget's end).
    # Both None when it does not loop.
    loop_start: int | None = None
    loop_period: int | None = None

    @property
    def stopped(self) -> bool:
        """Finished by its stop token (which is then the last output id)."""
        return self.finish_reason.get("type") == "stop"

    @property
    def text_end(self) -> int:
        """How many output ids carry text: all but a matched stop token."""
        return len(self.output_ids) - 1 if self.stopped else len(self.output_ids)

    def text(self, skip_special_tokens: bool) -> str:
        """The whole text SGLang returns: the matched stop token trimmed."""
        return self.vocab.decode(self.output_ids[: self.text_end], skip_special_tokens=skip_special_tokens)

    def reasoning_tokens_after(self, generated: int) -> int:
        """How many reasoning words are among the first `generated` tokens."""
        return min(max(generated - self.reasoning_start, 0), self.reasoning_tokens)


def plan_completion(
    prompt: Sequence[int] | str,
    *,
    seed: int,
    max_new_tokens: int,
    lengths: LengthModel,
    vocab: SimVocab,
    reasoning_format: str = DEFAULT_REASONING_FORMAT,
    loops: LoopModel = NO_LOOPS,
) -> CompletionPlan:
    """The completion of `prompt`, its markers written as `reasoning_format` (an SGLang parser name)."""
    return plan_seeded(
        completion_seed(prompt, seed), prompt_opening(prompt, vocab), max_new_tokens=max_new_tokens,
        lengths=lengths, vocab=vocab, reasoning_format=reasoning_format, loops=loops,
    )


def plan_seeded(
    rng_seed: int,
    opening: Opening,
    *,
    max_new_tokens: int,
    lengths: LengthModel,
    vocab: SimVocab,
    reasoning_format: str = DEFAULT_REASONING_FORMAT,
    loops: LoopModel = NO_LOOPS,
) -> CompletionPlan:
    """The completion a prompt with this completion seed and opening gets: all a prompt decides."""
    fmt = get_reasoning_format(reasoning_format)
    rng = random.Random(rng_seed)
    markers = _Markers.for_completion(fmt, opening, vocab)
    # The length comes from `rng` first, then the words: reordering the draws would change every completion.
    budget = _WordBudget.draw(lengths, rng, markers, max_new_tokens)
    loop = draw_loop(loops, rng_seed, vocab.word_ids)  # its own RNG: `rng` draws the same either way
    loop_start = None if loop is None else place_loop(
        loop.drawn_start, markers.runs(budget.reasoning_words), budget.natural_length)
    # Words are drawn only as far as the budget reaches; `choices` spends one random() per word,
    # so a smaller max_new_tokens yields a prefix of the same completion.
    out = _BoundedOutput(budget.room if loop_start is None else min(max_new_tokens, loop_start))
    layout = _write_output(out, rng, vocab, markers, budget)
    ids = out.ids
    if loop is None:
        finish = _finish(ids, max_new_tokens, markers.stop_id)
    else:
        extend_with_loop(ids, loop.period_ids, max_new_tokens)
        finish = {"type": "length", "length": max_new_tokens}  # a loop never reaches its stop token
        if markers.thinking and len(markers.open_ids) <= loop_start <= layout.reasoning_end:
            # The loop began in the reasoning, which it never closes: all of it is reasoning.
            layout = Layout(layout.reasoning_start, len(ids), len(ids))
    return assemble_plan(
        ids, finish, layout, opening=opening, reasoning_format=fmt.name, vocab=vocab, rng_seed=rng_seed,
        loop_start=loop_start, loop_period=None if loop is None else len(loop.period_ids),
    )


@dataclass(frozen=True)
class Layout:
    """Where the reasoning words and the content words start and end in the output ids."""

    reasoning_start: int
    reasoning_end: int
    content_start: int


def assemble_plan(
    ids: list[int],
    finish: dict[str, Any],
    layout: Layout,
    *,
    opening: Opening,
    reasoning_format: str,
    vocab: SimVocab,
    rng_seed: int,
    loop_start: int | None = None,
    loop_period: int | None = None,
) -> CompletionPlan:
    """A plan from its output ids, finish and layout: the texts and counts follow from them."""
    text_end = len(ids) - 1 if finish["type"] == "stop" else len(ids)
    return CompletionPlan(
        output_ids=ids,
        finish_reason=finish,
        completion_tokens=len(ids),
        reasoning_tokens=layout.reasoning_end - layout.reasoning_start,
        reasoning_text=vocab.decode(ids[layout.reasoning_start:layout.reasoning_end], skip_special_tokens=False),
        content_text=vocab.decode(ids[layout.content_start:text_end], skip_special_tokens=False),
        reasoning_start=layout.reasoning_start,
        opening=opening,
        reasoning_end=layout.reasoning_end,
        content_start=layout.content_start,
        reasoning_format=reasoning_format,
        vocab=vocab,
        rng_seed=rng_seed,
        loop_start=loop_start,
        loop_period=loop_period,
    )


@dataclass(frozen=True)
class _Markers:
    """The marker ids one completion writes: none of the reasoning ones with thinking off, and no
    open marker when the prompt already opened the reasoning."""

    thinking: bool
    open_ids: Sequence[int]
    close_ids: Sequence[int]
    content_open_ids: Sequence[int]
    stop_id: int

    @classmethod
    def for_completion(cls, fmt: ReasoningFormat, opening: Opening, vocab: SimVocab) -> _Markers:
        thinking = fmt.reasons and opening is not Opening.THINKING_OFF
        open_ids = vocab.marker_ids(fmt.reasoning_open) if thinking and not (
            fmt.prompt_may_open and opening is Opening.INSIDE_REASONING) else ()
        close_ids = vocab.marker_ids(fmt.reasoning_close) if thinking else ()
        content_open_ids = vocab.marker_ids(fmt.content_open) if fmt.content_open else ()
        (stop_id,) = vocab.marker_ids(fmt.stop)
        return cls(thinking, open_ids, close_ids, content_open_ids, stop_id)

    @property
    def count(self) -> int:
        """Marker ids before the stop token."""
        return len(self.open_ids) + len(self.close_ids) + len(self.content_open_ids)

    def runs(self, reasoning_words: int) -> list[tuple[int, int]]:
        """Where the markers sit in the output ids, as [start, end) runs (where a loop may not start)."""
        opened = len(self.open_ids)
        if not self.thinking:
            return [(0, len(self.content_open_ids))]
        closing = opened + reasoning_words
        return [(0, opened), (closing, closing + len(self.close_ids) + len(self.content_open_ids))]


@dataclass(frozen=True)
class _WordBudget:
    """How many reasoning and content words to draw, and how many ids fit before the stop token."""

    reasoning_words: int
    content_words: int
    room: int
    natural_length: int  # ids before the stop token, whatever the budget

    @classmethod
    def draw(cls, lengths: LengthModel, rng: random.Random, markers: _Markers, max_new_tokens: int) -> _WordBudget:
        if lengths.tokens is None:
            words = lengths.draw_words(rng)
            n_reasoning, n_content = lengths.split(words) if markers.thinking else (0, words)
            # The stop token comes once every word is out, if the budget has room left for it.
            natural = markers.count + n_reasoning + n_content
            return cls(n_reasoning, n_content, room=max(0, max_new_tokens), natural_length=natural)
        # Exactly `total` tokens: the markers, the words between them, the stop token. Shorter
        # than its markers, the completion is their first `total - 1` tokens and the stop token
        # (just the stop token for a length of 1).
        total = lengths.draw_tokens(rng)
        words = total - 1 - markers.count
        n_reasoning, n_content = lengths.split_exact(words) if markers.thinking else (0, max(words, 0))
        return cls(n_reasoning, n_content, room=min(max(0, max_new_tokens), total - 1), natural_length=total - 1)


def _write_output(
    out: _BoundedOutput, rng: random.Random, vocab: SimVocab, markers: _Markers, budget: _WordBudget
) -> Layout:
    """Markers and words in the order the model writes them, cut where the budget runs out."""
    reasoning_start = reasoning_end = 0
    if markers.thinking:
        out.extend(markers.open_ids)
        reasoning_start = len(out.ids)
        out.draw_words(rng, vocab, budget.reasoning_words)
        reasoning_end = len(out.ids)
        out.extend(markers.close_ids)
    out.extend(markers.content_open_ids)
    content_start = len(out.ids)
    out.draw_words(rng, vocab, budget.content_words)
    return Layout(reasoning_start, reasoning_end, content_start)


def _finish(ids: list[int], max_new_tokens: int, stop_id: int) -> dict[str, Any]:
    """The finish reason; appends the stop token when the budget left room for it."""
    if max_new_tokens > len(ids):
        # The stop token was generated: SGLang sends and counts it (the text trims it).
        ids.append(stop_id)
        return {"type": "stop", "matched": stop_id}
    return {"type": "length", "length": max_new_tokens}


class _BoundedOutput:
    """Output ids that stop growing at max_new_tokens: a cut may fall inside a marker."""

    def __init__(self, max_new_tokens: int) -> None:
        self.ids: list[int] = []
        self.room = max(0, max_new_tokens)

    def extend(self, ids: Sequence[int]) -> None:
        taken = ids[: self.room]
        self.ids += taken
        self.room -= len(taken)

    def draw_words(self, rng: random.Random, vocab: SimVocab, count: int) -> None:
        count = min(count, self.room)
        if count > 0:
            self.ids += rng.choices(vocab.word_ids, k=count)
            self.room -= count
