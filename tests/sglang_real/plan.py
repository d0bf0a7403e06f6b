"""The deterministic "model" the real SGLang server runs in this tier: its next token is a function
of the tokens it has seen, so every record genfleet writes can be checked token for token.

The plan of an assistant turn is a function of the conversation before it: the sequence up to and
including its last `<|im_middle|>` (the chat template writes that marker right before each
assistant reply, and the plan never emits it). From there the model follows one of two token
sequences, seeded by a blake2b digest of that context:

    thinking on:   <think> reasoning words </think> content words <|im_end|>
    thinking off:  <think> </think> content words <|im_end|>

Whatever already follows the marker (the template's own `<think>` or `<think></think>`, or an
earlier request's output that a continuation sends back as prompt) picks the sequence and the
position, so a continuation gets the rest of the plan exactly as one request with a larger
`max_new_tokens` would have: the property greedy decoding gives a real model. A context whose
tail agrees with neither sequence ends at once (`<|im_end|>`).

Directives in the prompt's text shape the plan (`[plan len=400 think=40 loop=3]`):
- `len=N`: about N content tokens (default: 10 to 60, drawn);
- `think=N`: about N reasoning tokens (default: 10 to 60, drawn);
- `loop=P`: after the content's first words, a period of P words repeats forever, never stopping
  (the loop guard's case); `forever`: words forever without a repeated period (the over-cap case).

Words mix ASCII with multi-byte ones (日本語, 😀, naïve): the byte-level BPE splits those across
tokens, so stream chunks and cut continuations land inside a character.

This module is pure Python (the `tokenizers` library only): the forward patch imports it inside the
server, and the tests import it to know what every record must hold.
"""
from __future__ import annotations

import hashlib
import random
import re
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer

ASCII_WORDS = (
    "the", "model", "reads", "each", "prompt", "and", "answers", "with", "care", "so", "that", "every",
    "token", "counts", "we", "check", "both", "halves", "of", "a", "reply", "before", "writing", "it",
    "down", "first", "then", "next", "because", "shards", "are", "durable", "fleet", "server", "batch",
)
MULTIBYTE_WORDS = ("日本語", "😀", "naïve", "café", "Ελληνικά", "🎉", "über", "中文", "Привет")
DIRECTIVES = re.compile(r"\[plan([^\]]*)\]")
LOOP_PREFIX_WORDS = 6


@dataclass(frozen=True)
class PlanVocab:
    """The ids the plan needs from the tier's tokenizer, and each word's ids."""

    tokenizer: Tokenizer
    think_start: int
    think_end: int
    eos: int
    im_middle: int
    word_ids: dict[str, tuple[int, ...]] = field(repr=False)

    @classmethod
    def from_dir(cls, model_dir: Path | str) -> PlanVocab:
        tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))

        def one(token: str) -> int:
            token_id = tokenizer.token_to_id(token)
            assert token_id is not None, f"{token} is not one token in {model_dir}"
            return token_id

        words = {word: tuple(tokenizer.encode(" " + word, add_special_tokens=False).ids)
                 for word in (*ASCII_WORDS, *MULTIBYTE_WORDS)}
        return cls(tokenizer, one("<think>"), one("</think>"), one("<|im_end|>"), one("<|im_middle|>"), words)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)


@dataclass(frozen=True)
class Directives:
    content_tokens: int | None = None
    reasoning_tokens: int | None = None
    loop_period: int | None = None
    forever: bool = False

    @classmethod
    def parse(cls, text: str) -> Directives:
        """The last `[plan ...]` in the text (the current turn's), or none."""
        found = DIRECTIVES.findall(text)
        if not found:
            return cls()
        values: dict[str, str] = {}
        for item in found[-1].split():
            name, _, value = item.partition("=")
            values[name] = value
        return cls(
            content_tokens=int(values["len"]) if "len" in values else None,
            reasoning_tokens=int(values["think"]) if "think" in values else None,
            loop_period=int(values["loop"]) if "loop" in values else None,
            forever="forever" in values,
        )


def context_seed(context: Sequence[int]) -> int:
    return int.from_bytes(hashlib.blake2b(array("I", context).tobytes(), digest_size=8).digest(), "little")


class Turn:
    """One assistant turn's plan: both sequences, extended lazily (a looping or endless plan has no end)."""

    def __init__(self, vocab: PlanVocab, context: Sequence[int]) -> None:
        self.vocab = vocab
        seed = context_seed(context)
        directives = Directives.parse(vocab.decode(context))
        rng = random.Random(seed)
        self.reasoning = self._words(rng, directives.reasoning_tokens or rng.randint(10, 60))
        self.directives = directives
        self._content_rng = random.Random(seed ^ 0x5EED)
        self._content: list[int] = []
        self._content_target = directives.content_tokens or random.Random(seed + 1).randint(10, 60)
        self._period: tuple[int, ...] | None = None
        self._period_at = 0  # where the period first starts in the content (`loop=P`)
        self._finished = False
        self.on_head = (vocab.think_start, *self.reasoning, vocab.think_end)
        self.off_head = (vocab.think_start, vocab.think_end)

    def _words(self, rng: random.Random, target: int) -> tuple[int, ...]:
        ids: list[int] = []
        while len(ids) < target:
            ids += self._word(rng)
        return tuple(ids)

    def _word(self, rng: random.Random) -> tuple[int, ...]:
        pool = MULTIBYTE_WORDS if rng.random() < 0.2 else ASCII_WORDS
        return self.vocab.word_ids[rng.choice(pool)]

    def content_at(self, index: int) -> int:
        """The content's `index`-th token: its words, then `<|im_end|>` (none for loop or forever)."""
        while len(self._content) <= index and not self._finished:
            self._grow()
        if index < len(self._content):
            return self._content[index]
        return self.vocab.eos

    def _grow(self) -> None:
        directives = self.directives
        if directives.loop_period:
            if self._period is None:
                for _ in range(LOOP_PREFIX_WORDS):
                    self._content += self._word(self._content_rng)
                self._period_at = len(self._content)
                self._period = tuple(i for _ in range(directives.loop_period) for i in self._word(self._content_rng))
            self._content += self._period
        elif directives.forever:
            self._content += self._word(self._content_rng)
        elif len(self._content) < self._content_target:
            self._content += self._word(self._content_rng)
        else:
            self._finished = True

    def loop_unit(self) -> tuple[int, tuple[int, ...]] | None:
        """For `loop=P`: where in the content the repeating unit first starts, and its ids."""
        self.content_at(0)
        return None if self._period is None else (self._period_at, self._period)

    def head_for(self, generated: Sequence[int]) -> tuple[int, ...] | None:
        """Which of the two sequences `generated` follows (the template's `<think></think>` picks
        thinking off), or None when it follows neither: a context this model never wrote."""
        head = self.off_head if tuple(generated[:2]) == self.off_head else self.on_head
        known = min(len(generated), len(head))
        if tuple(generated[:known]) != head[:known]:
            return None
        if any(self.content_at(i) != token for i, token in enumerate(generated[len(head):])):
            return None
        return head

    def token_at(self, head: tuple[int, ...], index: int) -> int:
        return head[index] if index < len(head) else self.content_at(index - len(head))

    def completion(self, generated: Sequence[int], max_new_tokens: int) -> list[int]:
        """What the server generates after `generated` with this budget, the stop token included:
        the next token after each prefix of it, with the sequence checked once (each planned token keeps it
        on the same head), so a plan of thousands of tokens takes milliseconds, not seconds."""
        head = self.head_for(generated)
        if head is None:
            return [self.vocab.eos][:max_new_tokens]
        out: list[int] = []
        while len(out) < max_new_tokens:
            token = self.token_at(head, len(generated) + len(out))
            out.append(token)
            if token == self.vocab.eos:
                break
        return out


def split_context(sequence: Sequence[int], vocab: PlanVocab) -> int:
    """Where the current turn's plan starts: after the last `<|im_middle|>` (0 when there is none)."""
    for index in range(len(sequence) - 1, -1, -1):
        if sequence[index] == vocab.im_middle:
            return index + 1
    return 0


class Planner:
    """Next tokens for many sequences, each turn's plan kept while it is used (bounded)."""

    def __init__(self, vocab: PlanVocab, max_turns: int = 4096) -> None:
        self.vocab = vocab
        self.max_turns = max_turns
        self._turns: dict[bytes, Turn] = {}

    def turn(self, context: Sequence[int]) -> Turn:
        key = array("I", context).tobytes()
        turn = self._turns.pop(key, None)
        if turn is None:
            turn = Turn(self.vocab, context)
            if len(self._turns) >= self.max_turns:
                self._turns.pop(next(iter(self._turns)))
        self._turns[key] = turn
        return turn


def expected_completion(vocab: PlanVocab, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
    """The output ids SGLang returns for `prompt_ids` with `max_new_tokens` (the stop token included,
    as SGLang 0.5.23 reports it in `output_ids`)."""
    start = split_context(prompt_ids, vocab)
    return Turn(vocab, prompt_ids[:start]).completion(prompt_ids[start:], max_new_tokens)
