"""Dataset readers: yield every row of a source file with its row index and line number, or a
clear error naming the file and line. A bad line never stops the rest of the file."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator


@dataclass(frozen=True)
class SourceRow:
    row: int  # 0-based index among the file's non-blank lines: the id when the row has none
    file: str
    line: int  # 1-based, for humans
    data: dict[str, Any]


@dataclass(frozen=True)
class MalformedRow:
    row: int
    file: str
    line: int
    reason: str


def read_jsonl(path: Path) -> Iterator[SourceRow | MalformedRow]:
    row = 0
    with open(path, "rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                data = json.loads(raw.rstrip(b"\r\n"))
            except ValueError as error:
                yield MalformedRow(row, str(path), line_number, f"invalid JSON: {error}")
            else:
                if isinstance(data, dict):
                    yield SourceRow(row, str(path), line_number, data)
                else:
                    yield MalformedRow(row, str(path), line_number,
                                       f"expected a JSON object, got {type(data).__name__}")
            row += 1


def read_dataset(path: Path) -> Iterator[SourceRow | MalformedRow]:
    if not path.is_file():
        raise FileNotFoundError(f"dataset file not found: {path}")
    if path.suffix != ".jsonl":
        raise ValueError(f"{path}: unsupported dataset format {path.suffix!r} (supported: .jsonl)")
    return read_jsonl(path)
