"""Deterministic completions: the token ids a simulated reasoning model returns for a prompt and seed."""
from __future__ import annotations

import enum
import hashlib
import math
import random
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sim.reasoning_formats import DEFAULT_REASONING_FORMAT, ReasoningFormat
from sim.reasoning_formats import reasoning_format as get_reasoning_format
from sim.vocab import THINK_END, THINK_START, SimVocab


@dataclass(frozen=True)
class LengthModel:
    """Lognormal completion length (reasoning plus content words), fitted by its median and mean."""

    median: float = 646.0
    mean: float = 1416.0
    scale: float = 1.0
    reasoning_share: float = 0.7
    # `--length-tokens LO:HI`: each completion is exactly this many tokens long (markers and the
    # stop token included), uniform over [LO, HI]; the lognormal above is then unused.
    tokens: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.tokens is not None and not 1 <= self.tokens[0] <= self.tokens[1]:
            raise ValueError(f"length tokens need 1 <= LO <= HI, got {self.tokens[0]}:{self.tokens[1]}")

    def draw_tokens(self, rng: random.Random) -> int:
        """The exact completion length in tokens (only with `tokens` set)."""
        assert self.tokens is not None
        low, high = self.tokens
        return rng.randint(low, high)

    def draw_words(self, rng: random.Random) -> int:
        # For a lognormal, mean / median = exp(sigma^2 / 2).
        sigma = math.sqrt(2.0 * math.log(self.mean / self.median)) if self.mean > self.median else 0.0
        return max(2, round(rng.lognormvariate(math.log(self.median), sigma) * self.scale))

    def split(self, words: int) -> tuple[int, int]:
        """Reasoning and content word counts, each at least one; a share of exactly 0 models a
        reasoning model that closes its thought at once (empty reasoning, the alarm's case)."""
        reasoning = max(1, round(words * self.reasoning_share)) if self.reasoning_share > 0 else 0
        return reasoning, max(1, words - reasoning)

    def split_exact(self, words: int) -> tuple[int, int]:
        """Reasoning and content word counts that add up to exactly `words` (for exact lengths):
        content gets the first word, reasoning (with a share above 0) the second."""
        if words <= 0:
            return 0, 0
        reasoning = max(1, round(words * self.reasoning_share)) if self.reasoning_share > 0 else 0
        reasoning = min(reasoning, words - 1)
        return reasoning, words - reasoning


class Opening(enum.Enum):
    """Where the prompt leaves the model: the chat template decides who writes `<think>`."""

    INSIDE_REASONING = "inside"  # prompt ends with <think> (Kimi-K2.5): output holds only </think>
    THINKING_OFF = "off"  # prompt ends with <think></think>: output is the answer alone
    MODEL_OPENS = "model"  # the model writes <think> itself (DeepSeek-R1 old, Qwen3)
    # Formats with other markers (kimi's ◁think▷, gpt-oss's channels) always open them
    # themselves; THINKING_OFF still means content only, for every format.


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
) -> CompletionPlan:
    """The completion of `prompt`, its markers written as `reasoning_format` (an SGLang parser name)."""
    fmt = get_reasoning_format(reasoning_format)
    rng_seed = completion_seed(prompt, seed)
    rng = random.Random(rng_seed)
    opening = prompt_opening(prompt, vocab)
    markers = _Markers.for_completion(fmt, opening, vocab)
    # The length comes from `rng` first, then the words: reordering the draws would change every completion.
    budget = _WordBudget.draw(lengths, rng, markers, max_new_tokens)
    # Words are drawn only as far as the budget reaches; `choices` spends one random() per word,
    # so a smaller max_new_tokens yields a prefix of the same completion.
    out = _BoundedOutput(budget.room)
    layout = _write_output(out, rng, vocab, markers, budget)
    ids = out.ids
    finish = _finish(ids, max_new_tokens, markers.stop_id)
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
        reasoning_format=fmt.name,
        vocab=vocab,
        rng_seed=rng_seed,
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


@dataclass(frozen=True)
class _WordBudget:
    """How many reasoning and content words to draw, and how many ids fit before the stop token."""

    reasoning_words: int
    content_words: int
    room: int

    @classmethod
    def draw(cls, lengths: LengthModel, rng: random.Random, markers: _Markers, max_new_tokens: int) -> _WordBudget:
        if lengths.tokens is None:
            words = lengths.draw_words(rng)
            n_reasoning, n_content = lengths.split(words) if markers.thinking else (0, words)
            # The stop token comes once every word is out, if the budget has room left for it.
            return cls(n_reasoning, n_content, room=max(0, max_new_tokens))
        # Exactly `total` tokens: the markers, the words between them, the stop token. Shorter
        # than its markers, the completion is their first `total - 1` tokens and the stop token
        # (just the stop token for a length of 1).
        total = lengths.draw_tokens(rng)
        words = total - 1 - markers.count
        n_reasoning, n_content = lengths.split_exact(words) if markers.thinking else (0, max(words, 0))
        return cls(n_reasoning, n_content, room=min(max(0, max_new_tokens), total - 1))


@dataclass(frozen=True)
class _Layout:
    """Where the reasoning words and the content words start and end in the output ids."""

    reasoning_start: int
    reasoning_end: int
    content_start: int


def _write_output(
    out: _BoundedOutput, rng: random.Random, vocab: SimVocab, markers: _Markers, budget: _WordBudget
) -> _Layout:
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
    return _Layout(reasoning_start, reasoning_end, content_start)


def _finish(ids: list[int], max_new_tokens: int, stop_id: int) -> dict[str, Any]:
    """The finish reason; appends the stop token when the budget left room for it."""
    if max_new_tokens > len(ids):
        # The stop token was generated: SGLang sends and counts it (the text trims it).
        ids.append(stop_id)
        return {"type": "stop", "matched": stop_id}
    return {"type": "length", "length": max_new_tokens}


def completion_seed(prompt: Sequence[int] | str, seed: int) -> int:
    """A process-independent RNG seed (never Python's salted `hash()`)."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(_prompt_bytes(prompt))
    digest.update((seed & 0xFFFF_FFFF_FFFF_FFFF).to_bytes(8, "little"))
    return int.from_bytes(digest.digest(), "little")


def prompt_opening(prompt: Sequence[int] | str, vocab: SimVocab) -> Opening:
    if isinstance(prompt, str):
        if prompt.endswith(THINK_START + THINK_END):
            return Opening.THINKING_OFF
        return Opening.INSIDE_REASONING if prompt.endswith(THINK_START) else Opening.MODEL_OPENS
    tail = list(prompt[-2:])
    if tail == [vocab.think_start_id, vocab.think_end_id]:
        return Opening.THINKING_OFF
    return Opening.INSIDE_REASONING if tail[-1:] == [vocab.think_start_id] else Opening.MODEL_OPENS


def _prompt_bytes(prompt: Sequence[int] | str) -> bytes:
    if isinstance(prompt, str):
        return prompt.encode("utf-8")
    ids = array("I", prompt)  # uint32; raises OverflowError on ids outside its range
    if sys.byteorder == "big":
        ids.byteswap()
    return ids.tobytes()


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
