"""The loop guard's cost on the hot path, how late it catches a loop, and the longest exact repeats of
legitimate text (the numbers behind workers/generation/loop_guard.py's defaults).

    .venv/bin/python -m bench.loop_guard [--tokens 2000000] [--corpus DIR ...]

measure(): CPU ns per token for streams of random word ids drawn as the simulator draws them
(completions of 8,192 tokens, a fresh detector each), fed in chunks of 1, 8 and 32 ids, and for the
same streams decoded to text and fed to a character detector. The target is well under 1 us a
token at chunk 32.
overruns(): tokens from a loop's first item to the check that finds it, per period.
longest_runs(): with --corpus, the longest exact periodic runs (128 ids or 400 characters and 2
repeats at least) in the files under the given directories, three tokenizations, longest first.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from genfleet.sim.vocab import SimVocab
from genfleet.workers.generation.loop_guard import DEFAULT, LoopDetector, LoopThresholds

COMPLETION = 8192
CHUNKS = (1, 8, 32)
WORDS = re.compile(r"\w+|[^\w\s]|\s+")
# Far below the defaults, to see how close legitimate text comes to them (a block pasted twice
# too), and checked at every item so that no run that long is missed between checks.
NEAR_IDS = LoopThresholds(max_period=512, min_repeats=2, min_span=128, check_every=1)
NEAR_CHARS = LoopThresholds(max_period=2048, min_repeats=2, min_span=400, check_every=1)
SUFFIXES = (".py", ".txt", ".md", ".rst", "")


def _cpu_ns(streams: Iterable[list], thresholds: LoopThresholds) -> int:
    """CPU time feeding each stream (a list of chunks, prepared beforehand) to a fresh detector."""
    spent = 0
    for chunks in streams:
        start = time.process_time_ns()
        detector = LoopDetector(thresholds)
        for chunk in chunks:
            detector.extend(chunk)
        spent += time.process_time_ns() - start
    return spent


def _streams(tokens: int, chunk: int, seed: int = 0) -> Iterable[list[list[int]]]:
    vocab = SimVocab.from_tokenizer_dir()
    rng = random.Random(seed)
    for _ in range(max(1, tokens // COMPLETION)):
        ids = rng.choices(vocab.word_ids, k=COMPLETION)
        yield [ids[at:at + chunk] for at in range(0, COMPLETION, chunk)]


def _text_streams(tokens: int, chunk: int) -> Iterable[list[str]]:
    """The same ids decoded, one text delta per `chunk` ids, as the chat API streams them."""
    vocab = SimVocab.from_tokenizer_dir()
    for chunks in _streams(tokens, chunk):
        yield [vocab.decode(ids, skip_special_tokens=True) for ids in chunks]


def measure(tokens: int = 2_000_000) -> dict:
    """CPU ns per token, by chunk size; `text_chunk_8`: the same streams as text, per token."""
    streams = max(1, tokens // COMPLETION)
    result = {f"chunk_{chunk}": _cpu_ns(_streams(tokens, chunk), DEFAULT) / (streams * COMPLETION)
              for chunk in CHUNKS}
    text_ns = _cpu_ns(_text_streams(tokens, 8), LoopThresholds.for_characters())
    result["text_chunk_8"] = text_ns / (streams * COMPLETION)
    return {key: round(value, 1) for key, value in result.items()}


def overruns(periods: Sequence[int] = range(5, 41), starts: int = 64, seed: int = 0) -> dict:
    """Tokens from a loop's first item to its finding: median and max over periods and start
    positions (the start's offset from the check grid spreads the check_every lag)."""
    rng = random.Random(seed)
    late = []
    for period in periods:
        for _ in range(starts):
            prefix = rng.sample(range(1000, 10**6), rng.randrange(0, 2000))
            unit = [rng.randrange(1000) for _ in range(period)]
            found = LoopDetector().extend(prefix + unit * (700 // period + 2))
            late.append(found.at_token - len(prefix))
    return {"periods": f"{min(periods)}..{max(periods)}", "median": statistics.median(late), "max": max(late),
            "bound": max(DEFAULT.latest(period) for period in periods)}


def _runs(seq: Sequence, thresholds: LoopThresholds) -> list[tuple[int, int, int]]:
    """(length, period, start) of every qualifying run, each followed to its end."""
    found, offset = [], 0
    while (loop := LoopDetector(thresholds).extend(seq[offset:])) is not None:
        period, end = loop.period, offset + loop.at_token
        while end < len(seq) and seq[end] == seq[end - period]:
            end += 1
        found.append((end - offset - loop.start, period, offset + loop.start))
        offset = end
    return found


def longest_runs(roots: Sequence[Path], top: int = 15) -> dict[str, list[str]]:
    from tokenizers import Tokenizer

    bpe = Tokenizer.from_file(str(Path(__file__).resolve().parent.parent / "sim" / "model" / "tokenizer.json"))
    vocab: dict[str, int] = {}
    found: dict[str, list] = {"bpe": [], "words": [], "characters": []}
    for path in sorted(p for root in roots for p in root.rglob("*") if p.is_file() and p.suffix in SUFFIXES):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary or unreadable: not text a model writes
        for how, seq, thresholds in (
            ("bpe", bpe.encode(text, add_special_tokens=False).ids, NEAR_IDS),
            ("words", [vocab.setdefault(word, len(vocab)) for word in WORDS.findall(text)], NEAR_IDS),
            ("characters", text, NEAR_CHARS),
        ):
            found[how] += [(length, period, str(path)) for length, period, _ in _runs(seq, thresholds)]
    return {how: [f"{length} ({length / period:.1f} x {period}) {path}" for length, period, path in
                  sorted(runs, reverse=True)[:top]] for how, runs in found.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2_000_000)
    parser.add_argument("--corpus", type=Path, nargs="*", default=[])
    args = parser.parse_args()
    print(json.dumps({"ns_per_token": measure(args.tokens), "overrun_tokens": overruns()}, indent=2))
    if args.corpus:
        print(json.dumps(longest_runs(args.corpus), indent=2))


if __name__ == "__main__":
    main()
