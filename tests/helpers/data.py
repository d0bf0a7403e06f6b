"""Input datasets the tests write: JSONL rows, numbered prompts, and the bundled sample data."""
from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from genfleet.demo import dataset_args, write_datasets


def write_jsonl(path: Path, rows: Iterable[dict | str]) -> Path:
    """One line per row; a string row is written as it is (a malformed line, on purpose)."""
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def read_jsonl(path: Path) -> list[dict]:
    """The JSON object on each non-empty line of `path`."""
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def write_prompts(path: Path, count: int, words: str = "a question", extra: Iterable[str] = ()) -> Path:
    """`count` rows `{"prompt": "<words> <i>"}`, then one row per prompt in `extra`."""
    prompts = [f"{words} {i}" for i in range(count)] + list(extra)
    return write_jsonl(path, [{"prompt": prompt} for prompt in prompts])


def sample_dataset_args(directory: Path, scale: float) -> list[str]:
    """Writes the bundled sample datasets (`make sample-data`, B1_glaive … B8_sweagent) at `scale`
    into `directory`; returns their `name=path[:partition]` arguments for `genfleet enqueue`."""
    return dataset_args(write_datasets(directory, scale=scale))
