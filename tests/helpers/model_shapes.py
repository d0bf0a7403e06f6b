"""The families' tokenizer directories (tests/model_shapes/shapes.py), built once per test process
into a temporary directory, as every tier uses them."""
from __future__ import annotations

import json
import sys
import tempfile
from functools import cache
from pathlib import Path

SHAPES_DIR = Path(__file__).resolve().parents[1] / "model_shapes"
sys.path.insert(0, str(SHAPES_DIR))

import shapes  # noqa: E402
from corpus import CONVERSATIONS  # noqa: E402

NAMES = tuple(shapes.SHAPES)
__all__ = ["CONVERSATIONS", "NAMES", "shape_dir", "facts", "thinking_variants"]


@cache
def _root() -> Path:
    return Path(tempfile.mkdtemp(prefix="genfleet-shapes-"))


@cache
def shape_dir(name: str) -> Path:
    path = _root() / name
    shapes.build(name, path)
    return path


def facts(name: str) -> dict:
    return json.loads((shape_dir(name) / "shape.json").read_text())


def thinking_variants(name: str) -> list[dict]:
    """The chat template kwargs a shape is templated with: its thinking switch on and off (none
    for a family without one)."""
    kwarg = facts(name)["thinking_kwarg"]
    return [{}] if kwarg is None else [{kwarg: True}, {kwarg: False}]
