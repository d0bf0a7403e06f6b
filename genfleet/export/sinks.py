"""Where exported lines go: JSONL files split by `--max-records-per-file`, hashed as they are written,
and the bounded-memory shuffle that can sit in front of them.

Layout under `--out`: `all.jsonl` (every dataset) and `datasets/{dataset}.jsonl`; with a record cap
per file, `all-00000.jsonl`, `all-00001.jsonl`, ... and `datasets/{dataset}-00000.jsonl`, ...
"""
from __future__ import annotations

import hashlib
import math
import random
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, NamedTuple

MERGED_STEM = "all"
DATASETS_DIR = "datasets"
ERRORS_SUFFIX = ".errors"  # the format's error file beside each output: all.errors.jsonl


class Series(NamedTuple):
    """The output a file is part of: a dataset's (`dataset`), or the merged one (None); its lines, or
    the dead letters of the format's error file (`errors`)."""
    dataset: str | None
    errors: bool = False


@dataclass(frozen=True)
class WrittenFile:
    path: Path
    records: int
    bytes: int
    sha256: str
    series: Series | None = None  # None: not a line output (missing.jsonl, stats.png)


class HashedFile:
    """A file written once, front to back, whose sha256 is known when it is closed."""

    def __init__(self, path: Path, series: Series | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.series = path, series
        self._file = open(path, "wb", buffering=1 << 20)
        self._hash = hashlib.sha256()
        self.records = 0
        self.bytes = 0

    def write(self, line: bytes) -> None:
        self._file.write(line)
        self._hash.update(line)
        self.records += 1
        self.bytes += len(line)

    def close(self) -> WrittenFile:
        self._file.close()
        return WrittenFile(self.path, self.records, self.bytes, self._hash.hexdigest(), self.series)


class JsonlSeries:
    """One logical output (a dataset, or all of them) as one file, or as numbered parts of at most
    `max_records` lines each. Files are created on the first line, so an empty output has none."""

    def __init__(self, directory: Path, stem: str, max_records: int | None, series: Series | None = None) -> None:
        self.directory, self.stem, self.max_records, self.series = directory, stem, max_records, series
        self._current: HashedFile | None = None
        self._written: list[WrittenFile] = []

    def write(self, line: bytes) -> None:
        if self._current is not None and self.max_records and self._current.records >= self.max_records:
            self._written.append(self._current.close())
            self._current = None
        if self._current is None:
            self._current = HashedFile(self.directory / self._next_name(), self.series)
        self._current.write(line)

    def close(self) -> list[WrittenFile]:
        if self._current is not None:
            self._written.append(self._current.close())
            self._current = None
        return self._written

    def _next_name(self) -> str:
        if not self.max_records:
            return f"{self.stem}.jsonl"
        return f"{self.stem}-{len(self._written):05d}.jsonl"


class OutputFiles:
    """Each line goes to its dataset's file and to the merged one (each optional)."""

    def __init__(self, out: Path, *, max_records: int | None, per_dataset: bool, merged: bool,
                 errors: bool = False) -> None:
        self.out, self.max_records, self.per_dataset, self.errors = out, max_records, per_dataset, errors
        self.suffix = ERRORS_SUFFIX if errors else ""
        self._merged = JsonlSeries(out, MERGED_STEM + self.suffix, max_records, Series(None, errors)) \
            if merged else None
        self._datasets: dict[str, JsonlSeries] = {}

    def write(self, dataset: str, line: bytes) -> None:
        if self._merged is not None:
            self._merged.write(line)
        if self.per_dataset:
            series = self._datasets.get(dataset)
            if series is None:
                series = self._datasets[dataset] = JsonlSeries(self.out / DATASETS_DIR, dataset + self.suffix,
                                                               self.max_records, Series(dataset, self.errors))
            series.write(line)

    def close(self) -> list[WrittenFile]:
        written = self._merged.close() if self._merged is not None else []
        for name in sorted(self._datasets):
            written += self._datasets[name].close()
        return written


class BucketShuffle:
    """A uniformly random order of any number of lines in bounded memory (two passes over disk).

    Pass 1 appends each line to one of `buckets` files chosen uniformly at random; pass 2 reads the
    buckets one at a time, shuffles each in memory and emits them in turn. Independent uniform
    bucket choices followed by a uniform shuffle within each bucket give a uniform permutation of
    the whole (Rao's two-pass shuffle). A bucket that came out larger than `max_bucket_bytes` is
    itself split the same way before it is read, so memory stays within about `max_bucket_bytes`
    plus 8 bytes per line of the bucket in hand, however many lines there are.
    """

    _HEADER = 8  # tag (uint32) and line length (uint32), big-endian
    # A bucket still too big after this many splits holds a few huge lines: read it as it is.
    _MAX_SPLITS = 6

    def __init__(self, workdir: Path, *, expected_bytes: int, max_bucket_bytes: int, seed: int,
                 max_open_buckets: int = 256) -> None:
        self.workdir = workdir
        self.max_bucket_bytes = max_bucket_bytes
        self.max_open_buckets = max_open_buckets
        self.rng = random.Random(seed)
        self.lines = 0
        workdir.mkdir(parents=True, exist_ok=True)
        self._buckets = self._open_buckets("b", self._bucket_count(expected_bytes))

    def add(self, tag: int, line: bytes) -> None:
        """Adds `line`, labelled with `tag` (a small integer the caller gets back with it)."""
        self._buckets[self.rng.randrange(len(self._buckets))][1].write(
            tag.to_bytes(4, "big") + len(line).to_bytes(4, "big") + line)
        self.lines += 1

    def drain(self) -> Iterator[tuple[int, bytes]]:
        """Every line added, as (tag, line), in a uniformly random order; deletes the bucket files."""
        paths = []
        for path, handle in self._buckets:
            handle.close()
            paths.append(path)
        self._buckets = []
        for path in paths:
            yield from self._drain_bucket(path, splits=0)

    def _drain_bucket(self, path: Path, splits: int) -> Iterator[tuple[int, bytes]]:
        size = path.stat().st_size
        if size > self.max_bucket_bytes and splits < self._MAX_SPLITS:
            parts = self._open_buckets(path.name + ".", max(2, self._bucket_count(size)))
            with open(path, "rb") as source:
                for frame in self._frames_of(source):
                    parts[self.rng.randrange(len(parts))][1].write(frame)
            path.unlink()
            for _, handle in parts:
                handle.close()
            for part, _ in parts:
                yield from self._drain_bucket(part, splits + 1)
            return
        data = path.read_bytes()
        path.unlink()
        offsets = array("Q")
        position = 0
        while position < len(data):
            offsets.append(position)
            position += self._HEADER + int.from_bytes(data[position + 4: position + 8], "big")
        self.rng.shuffle(offsets)
        for offset in offsets:
            length = int.from_bytes(data[offset + 4: offset + 8], "big")
            start = offset + self._HEADER
            yield int.from_bytes(data[offset: offset + 4], "big"), data[start: start + length]

    def _bucket_count(self, size: int) -> int:
        # Twice what an even split needs: random buckets come out uneven; oversized ones split again.
        return max(1, min(self.max_open_buckets, 2 * math.ceil(size / self.max_bucket_bytes)))

    def _open_buckets(self, prefix: str, count: int) -> list[tuple[Path, BinaryIO]]:
        buckets = []
        for index in range(count):
            path = self.workdir / f"{prefix}{index:04d}"
            buckets.append((path, open(path, "wb", buffering=1 << 16)))
        return buckets

    def _frames_of(self, source: BinaryIO) -> Iterator[bytes]:
        while header := source.read(self._HEADER):
            length = int.from_bytes(header[4:], "big")
            yield header + source.read(length)
