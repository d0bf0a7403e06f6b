"""The shard layout, shared by the worker that writes shards and the export that reads them back,
and the reader (from one or several output roots, e.g. copied from several hosts).

Layout: `{out}/{run}/{dataset}/{worker}-{seq:05d}.jsonl`, with `.open` appended while the shard is
being written; sealing a shard renames it without the suffix.

`ShardWriter` writes whole lines and fsyncs each before its task is acknowledged, so every line of
a sealed shard is complete, and only the last line of a `.open` shard can be torn (a crash, or a
worker still writing while we read). That one is tolerated and reported; any other line that is not
a valid record is an error naming its file and line.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from genfleet.common import GenfleetError
from genfleet.common.names import check_name, inside

SHARD_SUFFIX = ".jsonl"
OPEN_SUFFIX = ".open"


def shard_dir(root: Path, run: str, dataset: str) -> Path:
    """Where one worker's (and every other worker's) shards of a run's dataset go. `UnsafeName` for a
    run or dataset name that breaks `common/names.py`'s rule or would lead outside `root`."""
    return inside(root, check_name("run", run), check_name("dataset", dataset))


def open_shard_name(worker: str, seq: int) -> str:
    """The name of a shard while it is being written."""
    return f"{worker}-{seq:05d}{SHARD_SUFFIX}{OPEN_SUFFIX}"


def sealed(path: Path) -> Path:
    """The name a `.open` shard gets once it is sealed."""
    return path.with_name(path.name.removesuffix(OPEN_SUFFIX))


def is_open_shard(name: str) -> bool:
    return name.endswith(OPEN_SUFFIX)


def is_shard(name: str) -> bool:
    """A shard's file name, sealed or open."""
    return name.endswith(SHARD_SUFFIX) or name.endswith(SHARD_SUFFIX + OPEN_SUFFIX)


def shard_seq(name: str, worker: str) -> int | None:
    """The sequence number of `worker`'s shard `name` (sealed or open), or None if it is not one."""
    match = re.match(rf"^{re.escape(worker)}-(\d+){re.escape(SHARD_SUFFIX)}(?:{re.escape(OPEN_SUFFIX)})?$", name)
    return int(match.group(1)) if match else None


# What export needs of a record, and the type each field must have.
_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "id": str, "dataset": str, "messages": list, "reasoning": str, "content": str,
    "finish_reason": str, "usage": dict,
}
_OPTIONAL: dict[str, type | tuple[type, ...]] = {
    "row": int, "output_ids": list, "turns": list, "run": str,
}


class ShardError(GenfleetError):
    """A shard line that is not a record (and is not the torn tail of an `.open` shard)."""

    def __init__(self, path: Path, line: int, reason: str) -> None:
        super().__init__(f"{path}:{line}: {reason}")
        self.path, self.line, self.reason = path, line, reason


@dataclass(frozen=True)
class Shard:
    path: Path
    dataset: str
    size: int  # bytes when listed; an `.open` shard may have grown since

    @property
    def is_open(self) -> bool:
        return is_open_shard(self.path.name)


@dataclass(frozen=True)
class TornLine:
    """The unfinished last line of an `.open` shard: its record was never acknowledged, so its
    prompt is either redone by the fleet or listed by reconciliation."""
    path: Path
    line: int
    size: int


@dataclass(frozen=True, slots=True)
class ShardLine:
    shard: Shard
    line: int
    record: dict[str, Any]
    size: int  # bytes, newline included

    @property
    def where(self) -> str:
        return f"{self.shard.path}:{self.line}"


def find_shards(roots: Sequence[Path], run: str) -> list[Shard]:
    """Every shard of `run` under the output roots, sealed and open, in a stable order: roots as
    given, then dataset, then file name (worker and sequence number)."""
    shards = []
    for root in roots:
        run_dir = root / run
        if not run_dir.is_dir():
            continue
        for dataset_dir in sorted(p for p in run_dir.iterdir() if p.is_dir()):
            for path in sorted(dataset_dir.iterdir()):
                if path.is_file() and is_shard(path.name):
                    shards.append(Shard(path, dataset_dir.name, path.stat().st_size))
    return shards


@dataclass
class ShardReader:
    """Yields every record line of the shards in order; collects the torn lines it tolerated."""
    shards: Sequence[Shard]
    run: str
    torn: list[TornLine] = field(default_factory=list)

    def __iter__(self) -> Iterator[ShardLine]:
        for shard in self.shards:
            yield from self._read(shard)

    def _read(self, shard: Shard) -> Iterator[ShardLine]:
        path, is_open = shard.path, shard.is_open
        try:
            handle = open(path, "rb")
        except FileNotFoundError:
            if not is_open:
                raise
            # Sealed since it was listed (renamed without `.open`): read it under its new name.
            path, is_open = sealed(path), False
            handle = open(path, "rb")
        with handle:
            for number, raw in enumerate(handle, start=1):
                if not raw.strip():
                    continue
                complete = raw.endswith(b"\n")
                try:
                    record = json.loads(raw)
                except ValueError as error:
                    if is_open and not complete:
                        self.torn.append(TornLine(path, number, len(raw)))
                        continue
                    what = "truncated line" if not complete else "invalid JSON"
                    raise ShardError(path, number, f"{what} ({error})") from None
                yield ShardLine(shard, number, self._checked(record, path, number), len(raw))

    def _checked(self, record: Any, path: Path, line: int) -> dict[str, Any]:
        problem = record_problem(record, self.run)
        if problem:
            raise ShardError(path, line, problem)
        return record


def record_problem(record: Any, run: str) -> str | None:
    """Why this JSON value is not a completion record of `run`, or None."""
    if not isinstance(record, dict):
        return f"not a record: a JSON {type(record).__name__}"
    for name, kind in _REQUIRED.items():
        if name not in record:
            return f"record has no {name!r}"
        if not isinstance(record[name], kind):
            return f"{name!r} is a {type(record[name]).__name__}"
    for name, kind in _OPTIONAL.items():
        value = record.get(name)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            return f"{name!r} is a {type(value).__name__}"
    if not all(isinstance(message, dict) for message in record["messages"]):
        return "'messages' holds something other than message objects"
    for number, turn in enumerate(record.get("turns") or (), start=1):
        if not isinstance(turn, dict) or not all(isinstance(turn.get(name), str)
                                                 for name in ("reasoning", "content", "finish_reason")):
            return f"turn {number} lacks reasoning, content or finish_reason"
    if record.get("run", run) != run:
        return f"record of run {record['run']!r} among the shards of run {run!r}"
    return None
