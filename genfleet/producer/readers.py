"""Dataset readers: a dataset is a file, a directory (saved HF dataset) or a glob of many. Every row is
yielded with its dataset-wide row index, file and line, or as a `MalformedRow` naming them; a bad row
never stops the rest.

Row indices count across the files in sorted path order, so ids stay stable across re-runs as long
as files are only ever appended to the end of that order.

What every reader yields: a row with its place in the dataset, or the reason it is unreadable.

JSON Lines, plain or compressed (`.gz`, `.zst`): one row per non-blank line. A bad line becomes a
`MalformedRow` naming file and line; the rest of the file is still read. A `.json` file holding one
JSON array is read as one row per element.

Columnar sources: Parquet files (extra `[parquet]`) and Hugging Face datasets written with
`save_to_disk` (extra `[hf]`). Rows come out as plain dicts; `line` is the 1-based record number.
"""
from __future__ import annotations

import glob
import gzip
import io
import json
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from genfleet.producer import ProducerError


@dataclass(slots=True)
class SourceRow:
    # 0-based index over the whole dataset (files in sorted order): the row's id when it has none.
    row: int
    file: str
    line: int  # 1-based, for humans: the line of a JSONL file, the record number of a columnar one
    data: dict[str, Any]


@dataclass(slots=True)
class MalformedRow:
    row: int
    file: str
    line: int
    reason: str


class DatasetReadError(ProducerError):
    """A whole source cannot be read (missing, unsupported, corrupt stream): the message says which."""


SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".jsonl.zst", ".json.zst", ".jsonl.zstd",
            ".json.zstd")


def handles_jsonl(path: Path) -> bool:
    return path.is_file() and path.name.endswith(SUFFIXES)


# Counting lines up front is worth it for the progress bar only while it is quick (~1 GB/s).
COUNT_LINES_UP_TO_BYTES = 2 << 30


def count_jsonl_rows(path: Path) -> int | None:
    """Lines in a plain JSONL file (blank ones included: a progress total, not a promise), else None."""
    if not path.name.endswith(".jsonl") or path.stat().st_size > COUNT_LINES_UP_TO_BYTES:
        return None
    lines, last = 0, b"\n"
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 24):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n")


def read_jsonl_rows(path: Path, first_row: int) -> Iterator[SourceRow | MalformedRow]:
    name = str(path)
    row, line_number = first_row, 0
    try:
        with _open(path) as handle:
            if ".jsonl" not in path.name and _holds_json_array(handle):
                yield from _array_rows(handle, name, first_row)
                return
            for line_number, raw in enumerate(handle, start=1):
                if raw.isspace():
                    continue
                yield _parse(raw, row, name, line_number)
                row += 1
    except (OSError, EOFError, zlib.error, _zstd_error()) as error:
        # A truncated or corrupt compressed stream: nothing after this point can be trusted.
        raise DatasetReadError(f"{name}: unreadable after line {line_number}: {error}") from error


def _parse(raw: bytes, row: int, name: str, line: int) -> SourceRow | MalformedRow:
    try:
        data = json.loads(raw)
    except UnicodeDecodeError as error:
        return MalformedRow(row, name, line, f"invalid UTF-8: {error.reason} at byte {error.start}")
    except ValueError as error:
        return MalformedRow(row, name, line, f"invalid JSON: {error}")
    if not isinstance(data, dict):
        return MalformedRow(row, name, line, f"expected a JSON object, got {type(data).__name__}")
    return SourceRow(row, name, line, data)


def _open(path: Path) -> BinaryIO:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rb")  # type: ignore[return-value]
    if path.name.endswith((".zst", ".zstd")):
        import zstandard

        # read_across_frames: files written by pzstd or concatenated are several frames.
        raw = open(path, "rb")  # noqa: SIM115 - closed by the stream reader (closefd)
        stream = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=True)
        return io.BufferedReader(stream, buffer_size=1 << 20)
    return open(path, "rb", buffering=1 << 20)


def _holds_json_array(handle: BinaryIO) -> bool:
    """A `.json` file may be JSON Lines or one array; peek without consuming (buffered streams)."""
    head = handle.peek(64)[:64] if hasattr(handle, "peek") else b""
    return head.lstrip()[:1] == b"["


def _array_rows(handle: BinaryIO, name: str, first_row: int) -> Iterator[SourceRow | MalformedRow]:
    try:
        items = json.loads(handle.read())
    except ValueError as error:
        raise DatasetReadError(f"{name}: invalid JSON array: {error}") from error
    for index, data in enumerate(items):
        line = index + 1  # the element's number: a JSON array has no useful line numbers
        if isinstance(data, dict):
            yield SourceRow(first_row + index, name, line, data)
        else:
            yield MalformedRow(first_row + index, name, line,
                               f"expected a JSON object, got {type(data).__name__}")


def _zstd_error() -> type[Exception]:
    try:
        import zstandard
    except ImportError:  # pragma: no cover - zstandard is a core dependency
        return OSError
    return zstandard.ZstdError


BATCH_ROWS = 2048
HF_MARKERS = ("state.json", "dataset_info.json")


# --- Parquet ---------------------------------------------------------------------------------
def handles_parquet(path: Path) -> bool:
    return path.is_file() and path.suffix == ".parquet"


def count_parquet_rows(path: Path) -> int | None:
    return _parquet_file(path).metadata.num_rows


def read_parquet_rows(path: Path, first_row: int) -> Iterator[SourceRow]:
    name, row = str(path), first_row
    try:
        for batch in _parquet_file(path).iter_batches(batch_size=BATCH_ROWS):
            for data in batch.to_pylist():
                yield SourceRow(row, name, row - first_row + 1, data)
                row += 1
    except OSError as error:  # pyarrow's ArrowInvalid / ArrowIOError are OSError subclasses or ValueErrors
        raise DatasetReadError(f"{name}: unreadable after record {row - first_row}: {error}") from error
    except ValueError as error:
        raise DatasetReadError(f"{name}: unreadable after record {row - first_row}: {error}") from error


def _parquet_file(path: Path) -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetReadError(f"{path}: reading Parquet needs pyarrow: pip install 'genfleet[parquet]'") from None
    try:
        return pq.ParquetFile(path)
    except (OSError, ValueError) as error:
        raise DatasetReadError(f"{path}: not a readable Parquet file: {error}") from error


# --- Hugging Face `save_to_disk` ---------------------------------------------------------------
def handles_hf(path: Path) -> bool:
    return path.is_dir() and (any((path / marker).is_file() for marker in HF_MARKERS)
                              or (path / "dataset_dict.json").is_file())


def count_hf_rows(path: Path) -> int | None:
    return _load_hf(path).num_rows


def read_hf_rows(path: Path, first_row: int) -> Iterator[SourceRow]:
    dataset, name, row = _load_hf(path), str(path), first_row
    # `iter` honours an indices mapping (a selected/shuffled dataset) where the raw arrow table would not.
    for batch in dataset.iter(batch_size=BATCH_ROWS):
        columns = list(batch)
        for values in zip(*(batch[column] for column in columns), strict=True):
            yield SourceRow(row, name, row - first_row + 1, dict(zip(columns, values, strict=True)))
            row += 1


def _load_hf(path: Path) -> Any:
    try:
        from datasets import Dataset, load_from_disk
    except ImportError:
        raise DatasetReadError(f"{path}: reading a saved Hugging Face dataset needs `datasets`: "
                               "pip install 'genfleet[hf]'") from None
    if (path / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in path.iterdir() if p.is_dir())
        raise DatasetReadError(f"{path} is a DatasetDict with splits {splits}: point at one split, "
                               f"e.g. {path / (splits[0] if splits else 'train')}")
    try:
        dataset = load_from_disk(str(path), keep_in_memory=False)
    except (OSError, ValueError) as error:
        raise DatasetReadError(f"{path}: not a readable saved dataset: {error}") from error
    if not isinstance(dataset, Dataset):  # pragma: no cover - DatasetDict caught above
        raise DatasetReadError(f"{path}: expected one Dataset, got {type(dataset).__name__}")
    return dataset.with_format(None)


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
    _Kind("jsonl", handles_jsonl, count_jsonl_rows, read_jsonl_rows),
    _Kind("parquet", handles_parquet, count_parquet_rows, read_parquet_rows),
    _Kind("hf", handles_hf, count_hf_rows, read_hf_rows),
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
