"""What the simulator generates for a prompt: lengths, loops, openings, reasoning formats, the
completion plan and its continuation.

How long a completion is: lognormal in words, or (`--length-tokens`) exactly N tokens.

`--loop-rate`: completions that fall into a repetition loop and never stop.

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
completion, and a continuation (sim.completion) keeps looping.

A drawn start that falls inside a marker (halfway through a Harmony header, say) moves past it:
into the reasoning after its open marker, into the content after its close and content-open
markers; one at the very start of the close marker stays there, and that loop never closes the
reasoning. A completion shorter than the drawn start loops from where its stop token would have
been (and one shorter than its markers, from the start of the marker it was cut in).

What a prompt decides about its completion: the completion's RNG seed and who opens the reasoning.

How the simulated model marks reasoning and content, for each reasoning parser SGLang names.

A model writes `reasoning_open` + reasoning + `reasoning_close` + `content_open` + content, then
its stop token. The markers are text, encoded with the model's tokenizer: most are single special
tokens, but Harmony's headers also hold ordinary words (`analysis`, `assistant`, `final`), which
survive `skip_special_tokens` as they do on a real gpt-oss server.

Deterministic completions: the token ids a simulated reasoning model returns for a prompt and seed.

Continuing a cut completion: a `/generate` request whose `input_ids` are an earlier request's
`input_ids + output_ids`, where that earlier request was cut (finished by "length", aborted, its
client gone, struck by a fault mid-stream), goes on with the same completion.

What it returns is the tail of the completion planned for the ORIGINAL prompt and seed with
max_new_tokens = (tokens already generated) + (this request's max_new_tokens), from the offset
already generated: continuing is the same, id for id, as having asked the larger budget at once,
as a real model conditioned on its own prefix would be, statistically. So the reasoning goes on
where it was (a prefix cut inside the reasoning gets its close marker later, as the longer plan
writes it), a looping completion keeps looping, and a continuation can itself be continued.

- The request's own sampling_seed is not used: the completion is the original's.
- `prompt_tokens` is `len(input_ids)`, the prefix included; prefill costs what any prompt does.
- The finish reason is this request's: `{"type": "length", "length": <its max_new_tokens>}`, or
  the stop token when the longer plan reaches it.
- The completion log's line of a continuation says `"continues": <rid it continues>`, and its
  `output_ids` and `text` are the tail only.
- A cut is remembered with the ids its client was sent: everything the response carried, or, for
  a client that left mid-stream, what was written before it left. Continuing from fewer ids (a
  client that lost chunks) is a new prompt. Text prompts count as their tokenizer ids.
- The sim remembers the last `MAX_CUTS` cuts (LRU), keyed by a blake2b digest of the id sequence,
  each as its completion seed, opening and offset (never the prompt itself).
"""
from __future__ import annotations

import enum
import hashlib
import math
import random
import re
import sys
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from hashlib import blake2b
from itertools import cycle, islice
from typing import Any

from genfleet.sim.vocab import EOS, THINK_END, THINK_START, SimVocab


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


class Opening(enum.Enum):
    """Where the prompt leaves the model: the chat template decides who writes `<think>`."""

    INSIDE_REASONING = "inside"  # prompt ends with <think> (Kimi-K2.5): output holds only </think>
    THINKING_OFF = "off"  # prompt ends with <think></think>: output is the answer alone
    MODEL_OPENS = "model"  # the model writes <think> itself (DeepSeek-R1 old, Qwen3)
    # Formats with other markers (kimi's ◁think▷, gpt-oss's channels) always open them
    # themselves; THINKING_OFF still means content only, for every format.


def completion_seed(prompt: Sequence[int] | str, seed: int) -> int:
    """A process-independent RNG seed (never Python's salted `hash()`)."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(prompt_bytes(prompt))
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


def prompt_bytes(prompt: Sequence[int] | str) -> bytes:
    """A text's UTF-8, or the ids as little-endian uint32 (OverflowError outside that range)."""
    if isinstance(prompt, str):
        return prompt.encode("utf-8")
    ids = array("I", prompt)
    if sys.byteorder == "big":
        ids.byteswap()
    return ids.tobytes()


# The marker pieces that must be special tokens, so that `skip_special_tokens` drops them.
_SPECIAL_PIECE = re.compile(r"<\|[^|<>]+\|>|</?think>|◁/?think▷")


@dataclass(frozen=True)
class ReasoningFormat:
    name: str
    reasoning_open: str = ""
    reasoning_close: str = ""
    # Opens the answer, with or without reasoning before it (Harmony's `final` channel header).
    content_open: str = ""
    stop: str = EOS
    # A prompt ending in `reasoning_open` has opened the reasoning already (Kimi-K2.5's template
    # ends in <think>), so the output holds only the close marker.
    prompt_may_open: bool = False

    @property
    def reasons(self) -> bool:
        return bool(self.reasoning_open)

    def markers(self) -> tuple[str, ...]:
        """Every marker this format writes, stop token included."""
        return tuple(m for m in (self.reasoning_open, self.reasoning_close, self.content_open, self.stop) if m)

    def check(self, vocab: SimVocab) -> None:
        """ValueError unless the tokenizer has every special token this format writes."""
        for marker in self.markers():
            for piece in _SPECIAL_PIECE.findall(marker):
                vocab.special_id(piece)


def _think(name: str) -> ReasoningFormat:
    return ReasoningFormat(name, THINK_START, THINK_END, prompt_may_open=True)


HARMONY_REASONING_OPEN = "<|channel|>analysis<|message|>"
HARMONY_CONTENT_OPEN = "<|channel|>final<|message|>"

REASONING_FORMATS: dict[str, ReasoningFormat] = {
    f.name: f
    for f in (
        _think("kimi_k2"),
        _think("deepseek-r1"),
        _think("qwen3"),
        _think("qwen3-thinking"),
        _think("glm45"),
        ReasoningFormat("kimi", "◁think▷", "◁/think▷"),  # Kimi-VL: never opened by the prompt
        ReasoningFormat(
            "gpt-oss",
            HARMONY_REASONING_OPEN,
            "<|end|><|start|>assistant",
            HARMONY_CONTENT_OPEN,
            stop="<|return|>",
        ),
        ReasoningFormat("none"),
    )
}
REASONING_FORMAT_NAMES = tuple(REASONING_FORMATS)
DEFAULT_REASONING_FORMAT = "kimi_k2"


def reasoning_format(name: str) -> ReasoningFormat:
    try:
        return REASONING_FORMATS[name]
    except KeyError:
        raise ValueError(
            f"unknown reasoning format {name!r}; choose one of {', '.join(REASONING_FORMAT_NAMES)}"
        ) from None


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
    # `completion_seed(prompt, seed)`: also seeds the request's decode-step sizes (sim.engine).
    rng_seed: int = 0
    # A looping completion (sim.completion): its ids from `loop_start` on repeat a period of
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
    fmt = _reasoning_format_named(reasoning_format)
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
        assert loop_start is not None  # placed whenever there is a loop
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


MAX_CUTS = 200_000


@dataclass(frozen=True, slots=True)
class Cut:
    """A completion cut after `generated` tokens, by the request `rid`."""

    rid: str
    rng_seed: int
    opening: Opening
    generated: int  # from the completion's very start, earlier continuations included


def continuation_tail(whole: CompletionPlan, offset: int, max_new_tokens: int) -> CompletionPlan:
    """What a continuation `offset` tokens in returns: `whole` (planned with a budget of offset +
    max_new_tokens) from `offset` on, its layout shifted, its finish the continuation's own."""
    ids = whole.output_ids[offset:]
    finish = whole.finish_reason if whole.stopped else {"type": "length", "length": max_new_tokens}
    layout = Layout(
        max(whole.reasoning_start - offset, 0),
        max(whole.reasoning_end - offset, 0),
        max(whole.content_start - offset, 0),
    )
    return assemble_plan(
        ids, finish, layout, opening=whole.opening, reasoning_format=whole.reasoning_format, vocab=whole.vocab,
        rng_seed=whole.rng_seed,
        loop_start=None if whole.loop_start is None else max(whole.loop_start - offset, 0),
        loop_period=whole.loop_period,
    )


def ids_digest(ids: Sequence[int]) -> bytes:
    """The key of an id sequence (ids are u32: checked when the request was parsed)."""
    return blake2b(array("I", ids).tobytes(), digest_size=16).digest()


class CutCompletions:
    """The cut completions a request may continue, least recently used dropped first."""

    def __init__(self, max_entries: int = MAX_CUTS) -> None:
        self._max_entries = max_entries
        self._cuts: OrderedDict[bytes, Cut] = OrderedDict()

    def __len__(self) -> int:
        return len(self._cuts)

    def remember(self, prompt_ids: Sequence[int], output_ids: Sequence[int], cut: Cut) -> None:
        """`prompt_ids + output_ids` continues `cut` from now on."""
        key = ids_digest([*prompt_ids, *output_ids])
        self._cuts[key] = cut
        self._cuts.move_to_end(key)
        if len(self._cuts) > self._max_entries:
            self._cuts.popitem(last=False)

    def find(self, input_ids: Sequence[int]) -> Cut | None:
        """The cut these ids continue, if any (kept: a failed continuation may be asked again)."""
        if not self._cuts:
            return None  # no digest to compute until something was cut
        key = ids_digest(input_ids)
        cut = self._cuts.get(key)
        if cut is not None:
            self._cuts.move_to_end(key)
        return cut


_reasoning_format_named = reasoning_format  # for the planners whose parameter shadows the name
