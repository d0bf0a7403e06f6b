"""A pickle payload that shows whether anything deserialised it."""
from __future__ import annotations

from pathlib import Path


class LeavesATrace:
    """Unpickling this opens (creates) a file: visible proof that a payload was deserialised."""

    def __init__(self, path: Path | str) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))
