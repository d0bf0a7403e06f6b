"""JSON Lines, plain or compressed (`.gz`, `.zst`): one row per non-blank line. A bad line becomes a
`MalformedRow` naming file and line; the rest of the file is still read. A `.json` file holding one
JSON array is read as one row per element."""
from __future__ import annotations

import gzip
import io
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from genfleet.producer.readers.rows import DatasetReadError, MalformedRow, SourceRow

SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".jsonl.zst", ".json.zst", ".jsonl.zstd",
            ".json.zstd")


def handles(path: Path) -> bool:
    return path.is_file() and path.name.endswith(SUFFIXES)


# Counting lines up front is worth it for the progress bar only while it is quick (~1 GB/s).
COUNT_LINES_UP_TO_BYTES = 2 << 30


def count_rows(path: Path) -> int | None:
    """Lines in a plain JSONL file (blank ones included: a progress total, not a promise), else None."""
    if not path.name.endswith(".jsonl") or path.stat().st_size > COUNT_LINES_UP_TO_BYTES:
        return None
    lines, last = 0, b"\n"
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 24):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n")


def read_rows(path: Path, first_row: int) -> Iterator[SourceRow | MalformedRow]:
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
        return io.BufferedReader(stream, buffer_size=1 << 20)  # type: ignore[arg-type]
    return open(path, "rb", buffering=1 << 20)


def _holds_json_array(handle: BinaryIO) -> bool:
    """A `.json` file may be JSON Lines or one array; peek without consuming (buffered streams)."""
    head = handle.peek(64)[:64] if hasattr(handle, "peek") else b""  # type: ignore[attr-defined]
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
