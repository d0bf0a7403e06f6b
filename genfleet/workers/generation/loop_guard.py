"""The loop guard: notice, while a completion streams, that the model is repeating itself verbatim.

Reasoning models sometimes fall into a loop, writing the same sentence or paragraph again and again
until max_new_tokens: the full cap of GPU time for a completion that is useless as data. The worker
feeds a LoopDetector the ids as they arrive (chat: the text) and stops the stream on a finding.

The rule. At position n, period p (1..max_period) qualifies when the p-periodic run ending at n,
seq[a:n] with seq[i] == seq[i + p], is span(p) = max(min_span, min_repeats * p) items or longer:
the unit occurs min_repeats times in a row and the run covers min_span. The smallest qualifying p is
reported, and `start` = a, where the whole run begins. Only exact repetition counts: a false
positive kills a legitimate completion, a missed loop only costs GPU time.

The check runs at positions that are multiples of check_every whatever the chunking (so every
chunking finds the same Loop), and costs one rfind in C: every qualifying run repeats the last
min_overlap items at distance p, so the occurrences of a shorter suffix (the needle) within the
last max_period are the only candidates, nearest (smallest p) first; each is then compared in
full, two slices. Ids are packed 4 bytes each into a bytearray, text kept as a str; only a bounded
window is kept (4,161 ids, 16,641 characters, at most twice that between trims).

The defaults, measured (tests/unit/test_loop_guard.py checks the corpora; bench/loop_guard.py
reproduces the figures). The main corpus: 943 files, 13.1 M characters (the 668 modules of
Debian's Python 3.11 stdlib; every LICENSE and METADATA, READMEs included, of the 101 distributions
in .venv), as ids of the repository's byte-level BPE (sim/model, 4.8 M), of a word-level split
(\\w+|[^\\w\\s]|\\s+, 4.3 M; closer to a large vocabulary) and as characters. Longest exact runs:
    238 ids, p = 1: a reST underline of 238 "^" (regex's METADATA), BPE and words alike;
    194 BPE ids (163 words), p = 6: 32 identical `'\ufffe'` lines (encodings/iso8859_8.py);
    424 characters, p = 13: the same lines. For p > 64 at most 3.7 repeats, for p > 128 at most 2.0
    (a block pasted twice: a license, a Makefile rule): nothing legitimate repeats a long unit often.
Hand-written fixtures (tests/unit/loop_corpus, generated digits and matrices): a numpy-printed
10x10 matrix of zeros, 319 word ids (p = 32; 228 BPE); 1/7 to 300 digits, one token per digit as
Qwen's tokenizer does, 300 (p = 6); tables, lists, code, a refrain, "Wait," chains: 161 at most.
A wider scan, 30,621 files and 338 M characters (a whole CPython install with its test suite, and
numpy, scipy and the rest of two site-packages), flags only idna/uts46data.py (a generated table
listing "a".."z" 13 times in a row) and test_email.py (the expected folding of 'xxxx ' * 20: one
5-line cycle 10 times): periodic by construction, like a table of 500 identical lines, and flagged
as intended. The nearest human-written text, scipy's test_filter_design.py, lists one root 14 times
(599 BPE ids, 7.0 repeats of p = 86): the reason min_repeats is 8, not 4.

Hence DEFAULT: min_span 512 ids (2.2x the longest real run, 1.6x the zeros matrix, 1.7x the
300-digit 1/7; longer exactly periodic output, 1/7 to 600 digits or that matrix with 20 rows (word
split), counts as a loop); min_repeats 8 (above scipy's 7.0, 2x the corpus's 3.7 for p > 64);
max_period 512 (paragraph loops, caught within 8 x 512 ids, against max_new_tokens in the tens of
thousands); check_every 32. A loop of period p is found at most span(p) + check_every - 1 items
after its first item: 543 ids for every p <= 64, inside the 600 required for sentence loops (p
5..40); median 528. for_characters (text, ~4 characters a token): max_period, min_span and
check_every x4 (2,048, 2,048, 128), min_repeats 8: the same bound in tokens at 4 characters a
token (2,175 characters; about 725 tokens for code at 3), 4.8x the longest real run of characters
(424). Given other token thresholds, for_characters scales them the same way.

CPU per token (bench/loop_guard.py, random word ids as the simulator streams them, this 2-core
machine): 41 ns at chunk 32, 54 at chunk 8, 140 at chunk 1 (the call itself); the same streams as
text deltas of 8 tokens, 92 ns a token. Real code (200 stdlib modules, chunk 32): about 50 ns.
"""
from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TypeVar

# A block extended in one slice comparison when searching where a run begins: long enough that a
# typical run takes a few comparisons, short enough that the final per-item walk is cheap.
_BLOCK = 64
# The needle searched for is min_span / 16 items (32 ids, 128 characters by default), or
# min_overlap where that is shorter. Measured on 200 stdlib modules at chunk 32: 8 ids cost 67-73
# ns a token against 49-53 for 32 (code repeats short phrases within max_period, and every repeat
# costs a slice comparison); 8 characters 110 ns a character, 128 characters 16. Much longer ones
# fill rfind's 64-bit skip filter (256 ids: 56 ns a token on random ids against 41).
_NEEDLE_FRACTION = 16
# Ids are packed 4 bytes each (array "I", enough for any vocabulary); the slicing arithmetic needs
# the real width, so it is read, not assumed.
_ID_BYTES = array("I").itemsize
# The usual figure for English prose with large vocabularies (reasoning is mostly prose; code runs
# nearer 3, where the character thresholds catch a loop later in tokens: the module docstring).
_CHARS_PER_TOKEN = 4

# The window searched: packed ids, or text as is (one detector holds one or the other).
_Buf = TypeVar("_Buf", bytearray, str)


@dataclass(frozen=True)
class LoopThresholds:
    """For token ids; the defaults are the module docstring's, measured."""

    max_period: int = 512  # longest repeating unit considered, in items (tokens)
    min_repeats: int = 8  # the unit must occur at least this many times in a row
    min_span: int = 512  # and the periodic run must cover at least this many items
    check_every: int = 32  # run the (cheap) check only when this many new items arrived since the last

    def __post_init__(self) -> None:
        if min(self.max_period, self.min_span, self.check_every) < 1 or self.min_repeats < 2:
            raise ValueError(f"loop thresholds out of range: {self}")

    @classmethod
    def for_characters(cls, tokens: LoopThresholds | None = None) -> LoopThresholds:
        """For the chat API, which streams text: token thresholds (the defaults unless given) with
        every length scaled by the ~4 characters of a token, so that the bound in tokens holds."""
        tokens = tokens or cls()
        return cls(max_period=tokens.max_period * _CHARS_PER_TOKEN, min_repeats=tokens.min_repeats,
                   min_span=tokens.min_span * _CHARS_PER_TOKEN, check_every=tokens.check_every * _CHARS_PER_TOKEN)

    def span(self, period: int) -> int:
        """How long a run of this period must be to count as a loop."""
        return max(self.min_span, self.min_repeats * period)

    def latest(self, period: int) -> int:
        """The most items a loop of this period can run past its start before it is found."""
        return self.span(period) + self.check_every - 1

    @property
    def min_overlap(self) -> int:
        """The fewest items any qualifying run repeats at its period: min over p of span(p) - p."""
        balance = self.min_span // self.min_repeats  # where min_span - p meets (min_repeats - 1) * p
        candidates = {1, self.max_period, balance, balance + 1}
        return max(1, min(self.span(p) - p for p in candidates if 1 <= p <= self.max_period))


DEFAULT = LoopThresholds()


@dataclass(frozen=True)
class Loop:
    period: int
    repeats: int  # whole units in the run at detection
    start: int  # index where the periodic run begins
    at_token: int  # the length of the sequence at the check that found it (a multiple of check_every)

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


class LoopDetector:
    """Feed it a completion's ids (or text) as they stream; `extend` returns the first Loop found."""

    __slots__ = ("_t", "_needle", "_horizon", "_ids", "_chars", "_width", "_base", "_pending", "_size", "_next",
                 "_text", "_found")

    def __init__(self, thresholds: LoopThresholds = DEFAULT, prefix: Sequence[int] | str = ()) -> None:
        self._t = thresholds
        # Any shorter suffix than min_overlap is repeated too by every qualifying run: searching for
        # it misses none (each occurrence found is then checked in full).
        self._needle = max(1, min(thresholds.min_overlap, thresholds.min_span // _NEEDLE_FRACTION))
        # Items a check at the next checkpoint may look at: the longest span, or the needle and its
        # furthest occurrence, plus how far a run found there can reach back (span + check_every).
        longest = max(thresholds.span(thresholds.max_period), self._needle + thresholds.max_period)
        self._horizon = longest + 2 * thresholds.check_every + 1
        # Items [_base, _base + len(buf) // _width), in the buffer of the first items' kind: ids 4
        # bytes each in _ids (appended in place); text in _chars, 1 byte a character for ASCII: packed
        # 4 bytes a character, the zero bytes defeat rfind's skip filter (measured 1.3x the time).
        self._ids = bytearray()
        self._chars = ""
        self._width = 1
        self._base = 0
        self._pending: list = []  # items after the buffer, packed at the next check (ids, or str pieces)
        self._size = 0
        self._text: bool | None = None  # str input (characters) or ids
        self._found: Loop | None = None
        self._next = thresholds.check_every
        if prefix:
            # Already checked at every multiple of check_every it holds: no check inside it, and the
            # next one is the first multiple after it, where a run that crosses the boundary shows.
            self._next = sys.maxsize
            self.extend(prefix)
            self._next = (self._size // thresholds.check_every + 1) * thresholds.check_every
            self._pack()
            self._trim()

    @property
    def found(self) -> Loop | None:
        return self._found

    def extend(self, items: Sequence[int] | str) -> Loop | None:
        """Append new items; the Loop the first time one is found, else None (after a finding too)."""
        if self._found is not None or not items:
            return None
        text = isinstance(items, str)
        if text is not self._text:
            self._set_kind(text)
        # Packed only at a check: one conversion per check_every items rather than one per chunk
        # (this method is all a chunk costs between checks, hence inline).
        if text:
            self._pending.append(items)
        else:
            self._pending += items
        self._size += len(items)
        if self._size < self._next:
            return None
        return self._check()

    def _set_kind(self, text: bool) -> None:
        if self._text is not None:
            # One detector, one kind: a mix would compare ids with characters.
            raise TypeError("a LoopDetector takes either token ids or text, not both")
        self._text = text
        if not text:
            self._width = _ID_BYTES

    def _pack(self) -> None:
        if self._text:
            self._chars += "".join(self._pending)
        else:
            self._ids += array("I", self._pending)  # OverflowError for an id that is not one
        self._pending = []

    def _trim(self) -> None:
        """Keep the horizon before the next checkpoint; cut only once as much again has piled up,
        so that the copy costs once per horizon, not once per check."""
        cut = self._next - self._horizon - self._base
        if cut >= self._horizon:
            if self._text:
                self._chars = self._chars[cut:]
            else:
                self._ids = self._ids[cut * self._width:]
            self._base += cut

    def _check(self) -> Loop | None:
        """Check at every checkpoint the new items reached."""
        self._pack()
        every = self._t.check_every
        while self._next <= self._size:
            end = self._next - self._base
            found = self._check_at(self._chars, end) if self._text else self._check_at(self._ids, end)
            if found is not None:
                self._found = found
                self._ids, self._chars, self._pending = bytearray(), "", []  # nothing more is looked at
                return found
            self._next += every
        self._trim()
        return None

    def _check_at(self, buf: _Buf, end: int) -> Loop | None:
        """The smallest qualifying period of the items before `end` (relative to buf), if any."""
        t, needle_len, w = self._t, self._needle, self._width
        if end <= needle_len:
            return None
        needle = buf[(end - needle_len) * w:end * w]
        low = max(0, end - needle_len - t.max_period) * w
        # Occurrences ending before `end`, nearest (smallest p) first; for ids, a byte offset that
        # is not a multiple of the width is a coincidence of bytes across ids, not an occurrence.
        at = buf.rfind(needle, low, (end - 1) * w)
        while at >= 0:
            if at % w == 0:
                period = end - needle_len - at // w
                span = t.span(period)
                if span <= end and buf[(end - span + period) * w:end * w] == buf[(end - span) * w:(end - period) * w]:
                    return self._loop(buf, end, period, end - span)
            at = buf.rfind(needle, low, at + len(needle) - 1)
        return None

    def _loop(self, buf: _Buf, end: int, period: int, start: int) -> Loop:
        """The Loop of the run of `period` known to begin at or before `start`: where it begins."""
        w = self._width
        shift, block, pos = period * w, _BLOCK * w, start * w  # in bytes (characters for text)
        # Whole blocks first (one C comparison each), then item by item inside the first that differs.
        while pos >= block and buf[pos - block:pos] == buf[pos - block + shift:pos + shift]:
            pos -= block
        while pos > 0 and buf[pos - w:pos] == buf[pos - w + shift:pos + shift]:
            pos -= w
        start = pos // w
        # start == 0 with _base > 0 would mean the run reaches past the horizon: only for a prefix
        # never checked, and then the oldest item kept is the best answer there is.
        at, begin = self._base + end, self._base + start
        return Loop(period=period, repeats=(at - begin) // period, start=begin, at_token=at)


class StreamWatch:
    """The loop guard on one stream: the server kind's stream loop (`workers/servers/`) hands it
    what has arrived after each chunk, and stops reading when it says so (`abort`); `flag` only
    remembers the finding (the completion runs to its end and is marked)."""

    def __init__(self, policy: str, thresholds: LoopThresholds, prefix: Sequence[int] | str = ()) -> None:
        if policy not in ("abort", "flag"):
            raise ValueError(f"no stream watch for loop guard {policy!r}")
        self.abort = policy == "abort"
        self.detector = LoopDetector(thresholds, prefix=prefix)
        self._ids_seen = 0
        self._reasoning_seen = 0
        self._content_seen = 0

    @property
    def loop(self) -> Loop | None:
        return self.detector.found

    def ids_arrived(self, ids: list[int]) -> bool:
        """`ids`: every id assembled so far (cumulative or not); True: stop reading now."""
        new = ids[self._ids_seen:]
        self._ids_seen = len(ids)
        if new:
            self.detector.extend(new)
        return self.abort and self.detector.found is not None

    def text_arrived(self, reasoning: str, content: str) -> bool:
        """The chat API's reasoning and content so far; fed as one stream of characters."""
        new = reasoning[self._reasoning_seen:] + content[self._content_seen:]
        self._reasoning_seen, self._content_seen = len(reasoning), len(content)
        if new:
            self.detector.extend(new)
        return self.abort and self.detector.found is not None
