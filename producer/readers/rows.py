"""What every reader yields: a row with its place in the dataset, or the reason it is unreadable."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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


class DatasetReadError(Exception):
    """A whole source cannot be read (missing, unsupported, corrupt stream): the message says which."""
