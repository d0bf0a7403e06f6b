"""The repository's Python sources, parsed: for the tests that check the code's own shape."""
from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from helpers.paths import REPO

# The product's layers below the operator tools (docs/ARCHITECTURE.md, "Layering"): genfleet.<layer>,
# each a folder of genfleet/ (linked from the repository's top by the same name).
LAYERS = ("common", "producer", "workers", "sim")


@dataclass(frozen=True)
class Module:
    path: Path  # relative to the repository
    text: str
    tree: ast.Module
    package: str  # its layer (`LAYERS`), `genfleet` (the operator tools), or a top-level folder


def folder(package: str) -> Path:
    return REPO / "genfleet" / package if package in LAYERS else REPO / package


def modules(package: str) -> Iterator[Module]:
    """Every module of `package` (a layer, `genfleet` without its layers, or a top-level folder), parsed."""
    root = folder(package)
    for path in sorted(root.rglob("*.py")):
        inside = path.relative_to(root).parts
        if "__pycache__" in path.parts or (package == "genfleet" and inside[0] in LAYERS):
            continue
        text = path.read_text(encoding="utf-8")
        yield Module(path.relative_to(REPO), text, ast.parse(text, filename=str(path)), package)
