"""The loop guard (workers/generation/loop_guard.py): it finds exactly the runs its rule describes, at the same
position whatever the chunking, soon enough after a loop starts, and never in legitimate text: hand-
written fixtures (tests/unit/loop_corpus), generated digits and matrices, and real files on this
machine (a deterministic sample of the stdlib, the installed distributions' licenses and READMEs)
tokenized with the repository's BPE, a word-level split and as characters."""
from __future__ import annotations

import re
import sysconfig
from decimal import Context, Decimal
from pathlib import Path

import pytest
from helpers.paths import TOKENIZER
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from genfleet.workers.generation.loop_guard import DEFAULT, Loop, LoopDetector, LoopThresholds

CORPUS = Path(__file__).parent / "loop_corpus"
# Small enough that hypothesis builds qualifying and near-miss runs often; their needles (1 and 3
# items) are far shorter than min_overlap (16, 48), so many candidates fail the full comparison.
SMALL = LoopThresholds(max_period=8, min_repeats=3, min_span=24, check_every=4)
NEEDLE_SHORTER = LoopThresholds(max_period=12, min_repeats=2, min_span=60, check_every=5)
WORDS = re.compile(r"\w+|[^\w\s]|\s+")
# As Qwen's tokenizer does: every digit its own token (a word split keeps "142857..." as one).
DIGIT_WORDS = re.compile(r"\d|[^\W\d]+|[^\w\s]|\s+")


def feed(detector: LoopDetector, seq, sizes: list[int]) -> Loop | None:
    """Feed seq in chunks of the given sizes (cycled); the first Loop extend returns."""
    found, at, turn = None, 0, 0
    while at < len(seq):
        size = sizes[turn % len(sizes)] if sizes else len(seq)
        result = detector.extend(seq[at:at + size])
        assert result is None or found is None, "a second finding"
        found, at, turn = found or result, at + size, turn + 1
    assert detector.found == found
    return found


def reference(seq: list[int], t: LoopThresholds) -> Loop | None:
    """The rule, by brute force: at each checkpoint, the smallest p whose run is long enough."""
    for end in range(t.check_every, len(seq) + 1, t.check_every):
        for period in range(1, min(t.max_period, end) + 1):
            i = end - period - 1
            while i >= 0 and seq[i] == seq[i + period]:
                i -= 1
            if end - (i + 1) >= t.span(period):
                return Loop(period, (end - i - 1) // period, i + 1, end)
    return None


runs = st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=10), st.integers(1, 9)), max_size=12)
chunkings = st.lists(st.integers(1, 40), min_size=1, max_size=6)


@pytest.mark.parametrize("thresholds", [SMALL, NEEDLE_SHORTER])
@settings(max_examples=300, deadline=None)
@given(pieces=runs, sizes=chunkings)
def test_finds_exactly_what_the_rule_says(thresholds, pieces, sizes):
    # Pieces repeated over a 4-letter alphabet: qualifying runs, runs just short of a span, runs
    # of a multiple of a period and accidental ones; no periodic run that long, no finding.
    seq = [item for unit, times in pieces for item in unit * times]
    assert feed(LoopDetector(thresholds), seq, sizes) == reference(seq, thresholds)


@st.composite
def looped(draw, max_period: int = DEFAULT.max_period):
    """(sequence, where the repetition truly starts, the unit's length): a prefix with no repeated
    item, maybe the unit's last few items, then the unit over and over past the bound."""
    prefix = draw(st.lists(st.integers(1000, 10**6), unique=True, max_size=600))
    period = draw(st.integers(1, max_period))
    unit = draw(st.lists(st.integers(0, 999), min_size=period, max_size=period))
    tail = unit[period - draw(st.integers(0, period - 1)):]
    true_start = len(prefix) + len(tail)
    length = true_start + DEFAULT.latest(period) + draw(st.integers(1, 100))
    seq = prefix + tail + unit * (DEFAULT.latest(period) // period + 2)
    return seq[:length], true_start, period, len(tail)


def check_found(found: Loop | None, true_start: int, period: int, tail: int) -> None:
    assert found is not None
    assert period % found.period == 0  # the unit's own period when it has a shorter one
    assert found.start == true_start - tail  # a tail of the unit before the loop is part of the run
    assert found.at_token % DEFAULT.check_every == 0
    assert found.repeats == (found.at_token - found.start) // found.period >= DEFAULT.min_repeats
    assert found.at_token - true_start <= DEFAULT.latest(found.period)


@settings(max_examples=150, deadline=None)
@given(case=looped(), sizes=chunkings)
def test_a_loop_is_found_in_time_and_the_same_in_any_chunking(case, sizes):
    seq, true_start, period, tail = case
    found = feed(LoopDetector(), seq, [])
    check_found(found, true_start, period, tail)
    assert feed(LoopDetector(), seq, sizes) == found


@settings(max_examples=100, deadline=None)
@given(case=looped(max_period=40), sizes=chunkings)
def test_a_sentence_loop_costs_under_600_tokens(case, sizes):
    # The acceptance bound: a loop of period 5..40 (1..40 here) is found within 600 tokens of its
    # start, the check_every lag included.
    seq, true_start, period, tail = case
    found = feed(LoopDetector(), seq, sizes)
    check_found(found, true_start, period, tail)
    assert found.at_token - true_start <= 600


@settings(max_examples=100, deadline=None)
@given(case=looped(), data=st.data(), sizes=chunkings)
def test_a_continuation_finds_a_loop_across_the_boundary(case, data, sizes):
    seq, true_start, period, tail = case
    whole = feed(LoopDetector(), seq, [])
    # The earlier part ends inside the run, before the check that found it (else it had been found):
    # anywhere, and just before that check, where the first check after it must be the same one.
    for cut in (data.draw(st.integers(whole.start, whole.at_token - 1)), whole.at_token - 1):
        continued = LoopDetector(prefix=seq[:cut])
        assert feed(continued, seq[cut:], sizes) == whole


def test_text_loops_with_character_thresholds():
    chars = LoopThresholds.for_characters()
    text = (CORPUS / "prose.txt").read_text()
    sentence = "Wait, let me recompute the sum of the first column once more. "
    found = feed(LoopDetector(chars), text + sentence * 60, [3, 17, 64])
    assert found.period == len(sentence) and found.start == len(text)
    assert found.at_token - len(text) <= chars.latest(len(sentence))
    continued = LoopDetector(chars, prefix=text + sentence * 5)
    assert feed(continued, sentence * 55, [50]) == found


@given(max_period=st.integers(1, 600), min_repeats=st.integers(2, 12), min_span=st.integers(1, 3000))
def test_min_overlap_is_the_least_any_period_repeats(max_period, min_repeats, min_span):
    # The needle is no longer than this, so no qualifying period is ever left unsearched.
    t = LoopThresholds(max_period, min_repeats, min_span, check_every=1)
    assert t.min_overlap == max(1, min(t.span(p) - p for p in range(1, max_period + 1)))


def test_after_a_finding_it_stays_found_and_refuses_mixed_input():
    detector = LoopDetector(SMALL)
    found = detector.extend([7] * 100)
    assert found == Loop(period=1, repeats=24, start=0, at_token=24)
    assert found.to_dict() == {"period": 1, "repeats": 24, "start": 0, "at_token": 24}
    assert detector.extend([7] * 100) is None and detector.found == found
    with pytest.raises(TypeError):
        LoopDetector(SMALL, prefix=[1, 2, 3]).extend("abc")
    with pytest.raises(ValueError):
        LoopThresholds(max_period=8, min_repeats=1, min_span=24, check_every=4)
    # The worker's overrides (in tokens) carry over to characters, scaled as the defaults are.
    assert LoopThresholds.for_characters(LoopThresholds(min_span=600)) == LoopThresholds(2048, 8, 2400, 128)


# Legitimate text: none of it may be flagged.


def generated_texts() -> dict[str, str]:
    unity = 10 ** 1010

    def arccot(x: int) -> int:
        total = term = unity // x
        n, sign = 3, -1
        while term:
            term //= x * x
            total, n, sign = total + sign * (term // n), n + 2, -sign
        return total

    row = "[" + " ".join(["0."] * 10) + "]"
    return {
        # Decimal: str() of an int this long is refused (the 4300-digit limit).
        "2**20000": str(Context(prec=7000).power(Decimal(2), 20000)),
        "pi, 1000 digits": str(4 * (4 * arccot(5) - arccot(239)))[:1001],
        # Periodic, 300 digits (50 periods): a legitimate answer, kept below min_span on purpose.
        "1/7, 300 digits": "0." + str(10**300 // 7),
        "np.zeros((10, 10))": "[" + "\n ".join([row] * 10) + "]",
    }


def fixture_texts() -> dict[str, str]:
    texts = {path.name: path.read_text(encoding="utf-8") for path in sorted(CORPUS.iterdir())}
    return {**texts, **generated_texts()}


def stdlib_and_licenses() -> dict[str, str]:
    """200 stdlib modules (every third, sorted) and the two where a scan of all found the longest
    runs, and every license and METADATA (the README, mostly) of the installed distributions."""
    stdlib = Path(sysconfig.get_path("stdlib"))
    modules = sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts and "test" not in p.parts)
    chosen = modules[::3][:200] + [stdlib / "encodings" / "iso8859_8.py", stdlib / "_pydecimal.py"]
    packages = Path(sysconfig.get_path("purelib"))
    licenses = sorted(packages.glob("*.dist-info/LICENSE*")) + sorted(packages.glob("*.dist-info/licenses/**/*"))
    chosen += licenses + sorted(packages.glob("*.dist-info/METADATA"))
    texts = {str(p): p.read_text(encoding="utf-8", errors="replace") for p in chosen if p.is_file()}
    assert len(texts) > 250, "the real corpus is missing"
    return texts


@pytest.fixture(scope="module")
def tokenizers() -> dict:
    bpe = Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))
    vocab: dict[str, int] = {}
    return {
        "bpe": lambda text: bpe.encode(text, add_special_tokens=False).ids,
        "words": lambda text: [vocab.setdefault(w, len(vocab)) for w in WORDS.findall(text)],
        "digit words": lambda text: [vocab.setdefault(w, len(vocab)) for w in DIGIT_WORDS.findall(text)],
    }


def flagged(texts: dict[str, str], tokenizers: dict) -> list[str]:
    found = []
    for name, text in texts.items():
        for how, tokenize in tokenizers.items():
            loop = LoopDetector().extend(tokenize(text))  # one piece: chunking does not matter
            found += [f"{name} ({how}): {loop}"] if loop else []
        loop = LoopDetector(LoopThresholds.for_characters()).extend(text)
        found += [f"{name} (characters): {loop}"] if loop else []
    return found


def test_output_periodic_for_longer_than_min_span_is_a_loop(tokenizers):
    # The other side of the margin (module docstring): as worthless as data as a loop, and as costly.
    row = "[" + " ".join(["0."] * 10) + "]"
    texts = {"1/7, 600 digits": "0." + "142857" * 100, "np.zeros((20, 10))": "[" + "\n ".join([row] * 20) + "]",
             "500 identical lines": "| 0 | 0 | 0 |\n" * 500}
    for name, text in texts.items():
        assert LoopDetector().extend(tokenizers["digit words"](text)), name
    lines = texts["500 identical lines"]
    assert LoopDetector().extend(tokenizers["bpe"](lines))
    assert LoopDetector(LoopThresholds.for_characters()).extend(lines)


def test_no_legitimate_fixture_is_flagged(tokenizers):
    assert flagged(fixture_texts(), tokenizers) == []


def test_no_real_file_is_flagged(tokenizers):
    assert flagged(stdlib_and_licenses(), tokenizers) == []
