"""Dataset readers: a dataset is a file, a directory (saved HF dataset) or a glob of many. Every row is
yielded with its dataset-wide row index, file and line, or as a `MalformedRow` naming them; a bad row
never stops the rest.

Row indices count across the files in sorted path order, so ids stay stable across re-runs as long
as files are only ever appended to the end of that order.
"""
from __future__ import annotations

import glob
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from genfleet.producer.readers import columnar, jsonl
from genfleet.producer.readers.rows import DatasetReadError, MalformedRow, SourceRow

__all__ = ["DatasetReadError", "DatasetSource", "MalformedRow", "SourceRow", "open_dataset", "read_dataset"]

GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True)
class _Kind:
    name: str
    handles: Callable[[Path], bool]
    count: Callable[[Path], int | None]
    read: Callable[[Path, int], Iterator[SourceRow | MalformedRow]]


# Checked in order; the first that handles a path reads it.
KINDS = (
    _Kind("jsonl", jsonl.handles, jsonl.count_rows, jsonl.read_rows),
    _Kind("parquet", columnar.handles_parquet, columnar.count_parquet_rows, columnar.read_parquet_rows),
    _Kind("hf", columnar.handles_hf, columnar.count_hf_rows, columnar.read_hf_rows),
)
SUPPORTED = ("JSONL (.jsonl/.json, optionally .gz or .zst), Parquet (.parquet), "
             "a directory written by datasets' save_to_disk")


@dataclass(frozen=True)
class DatasetSource:
    pattern: str
    files: tuple[tuple[Path, _Kind], ...]

    def rows(self) -> Iterator[SourceRow | MalformedRow]:
        next_row = 0
        for path, kind in self.files:
            for item in kind.read(path, next_row):
                yield item
                next_row = item.row + 1

    def known_rows(self) -> int | None:
        """Rows in all files when every format knows it up front (Parquet, HF), else None."""
        total = 0
        for path, kind in self.files:
            count = kind.count(path)
            if count is None:
                return None
            total += count
        return total


def open_dataset(pattern: str | Path) -> DatasetSource:
    """Resolves a path or glob to its files, in the sorted order that fixes row indices."""
    text = str(pattern)
    if GLOB_CHARS & set(text):
        paths = sorted(Path(p) for p in glob.glob(text, recursive=True))
        if not paths:
            raise DatasetReadError(f"no files match {text}")
    else:
        paths = [Path(text)]
        if not paths[0].exists():
            raise DatasetReadError(f"dataset file not found: {text}")
    return DatasetSource(text, tuple((path, _kind_of(path)) for path in paths))


def read_dataset(pattern: str | Path) -> Iterator[SourceRow | MalformedRow]:
    return open_dataset(pattern).rows()


def _kind_of(path: Path) -> _Kind:
    for kind in KINDS:
        if kind.handles(path):
            return kind
    raise DatasetReadError(f"{path}: unsupported dataset format (supported: {SUPPORTED})")
