"""The repository's Python sources, parsed: for the tests that check the code's own shape."""
from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from helpers.paths import REPO


@dataclass(frozen=True)
class Module:
    path: Path  # relative to the repository
    text: str
    tree: ast.Module

    @property
    def package(self) -> str:
        return self.path.parts[0]


def modules(package: str) -> Iterator[Module]:
    """Every module under the top-level directory `package`, parsed."""
    for path in sorted((REPO / package).rglob("*.py")):
        if "__pycache__" not in path.parts:
            text = path.read_text(encoding="utf-8")
            yield Module(path.relative_to(REPO), text, ast.parse(text, filename=str(path)))
