"""Samples (`--samples N`): the N records of one prompt, gathered by prompt for the formats that
write one line per prompt, and counted per prompt for the manifest.

A sample's record id is `{prompt id}#{k}` and its `sample` field is k; each sample has its own row
slot, so dedupe and reconciliation treat samples as the distinct records they are.

Gathering them without holding the run in memory: a prompt's samples are written by whichever
workers ran them, so they arrive in any shard, in any order, possibly hours apart. During the read
pass each sample kept goes to one of several spill files on disk, chosen by a hash of its (dataset,
prompt id): every sample of a prompt lands in the same file. After the pass each file is read on
its own, sorted by (dataset, prompt id, k) and handed out group by group. A file larger than the
memory budget is first split again by a differently salted hash (a prompt's samples still stay
together), so memory stays near the budget however many samples there are; only a single prompt
whose samples alone exceed it is read whole.
"""
from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from itertools import groupby
from pathlib import Path
from typing import Any, BinaryIO

from genfleet.export.conversation import Record

# One prompt's samples, in sample order: (k, the part its format kept, or None when only counted).
Samples = list[tuple[int, Any]]


def prompt_id_of(record: Record) -> str:
    """The id of the prompt a record answers: a sample's id without its `#k`."""
    sample = record.get("sample")
    return record["id"] if sample is None else record["id"].removesuffix(f"#{sample}")


class SampleGroups:
    """Spills samples to disk by prompt and gives them back grouped (see the module docstring).
    Files are created on the first sample: an export without samples writes nothing here."""

    # A bucket still too big after this many splits holds a few huge prompts: read it as it is.
    _MAX_SPLITS = 4

    def __init__(self, workdir: Path, *, expected_bytes: int, max_bucket_bytes: int,
                 max_open_buckets: int = 256) -> None:
        self.workdir = workdir
        self.max_bucket_bytes = max_bucket_bytes
        self.max_open_buckets = max_open_buckets
        self.expected_bytes = expected_bytes
        self.added = 0
        self._buckets: list[tuple[Path, BinaryIO]] = []

    def add(self, dataset: str, prompt_id: str, sample: int, part: Any = None) -> None:
        """One sample of `prompt_id`; `part` is JSON-able (None: the sample is only counted)."""
        if not self._buckets:
            self.workdir.mkdir(parents=True, exist_ok=True)
            self._buckets = self._open("b", self._bucket_count(self.expected_bytes))
        key = json.dumps([dataset, prompt_id, sample], ensure_ascii=False, separators=(",", ":")).encode()
        # JSON escapes tabs and newlines inside strings, so "\t" and "\n" frame an entry unambiguously.
        entry = key + b"\t" + json.dumps(part, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        self._buckets[_bucket_of(dataset, prompt_id, 0, len(self._buckets))][1].write(entry)
        self.added += 1

    def drain(self) -> Iterator[tuple[str, str, Samples]]:
        """(dataset, prompt id, its samples in sample order) for every prompt added, ordered by
        bucket, then dataset and prompt id (the same shards give the same order); deletes the files."""
        buckets, self._buckets = self._buckets, []
        for _, handle in buckets:
            handle.close()
        for path, _ in buckets:
            yield from self._drain_bucket(path, splits=0)

    def close(self) -> None:
        """Closes what a stopped export left open (the directory itself is its caller's to remove)."""
        for _, handle in self._buckets:
            handle.close()
        self._buckets = []

    def _drain_bucket(self, path: Path, splits: int) -> Iterator[tuple[str, str, Samples]]:
        if path.stat().st_size > self.max_bucket_bytes and splits < self._MAX_SPLITS:
            parts = self._open(path.name + ".", max(2, self._bucket_count(path.stat().st_size)))
            with open(path, "rb") as source:
                for entry in source:
                    dataset, prompt_id, _ = json.loads(entry.split(b"\t", 1)[0])
                    parts[_bucket_of(dataset, prompt_id, splits + 1, len(parts))][1].write(entry)
            path.unlink()
            for _, handle in parts:
                handle.close()
            for part, _ in parts:
                yield from self._drain_bucket(part, splits + 1)
            return
        entries = []
        with open(path, "rb") as source:
            for entry in source:
                key, part = entry.rstrip(b"\n").split(b"\t", 1)
                dataset, prompt_id, sample = json.loads(key)
                entries.append((dataset, prompt_id, sample, part))  # the part stays bytes until its group's turn
        path.unlink()
        entries.sort(key=lambda entry: entry[:3])
        for (dataset, prompt_id), group in groupby(entries, key=lambda entry: entry[:2]):
            yield dataset, prompt_id, [(sample, json.loads(part)) for _, _, sample, part in group]

    def _bucket_count(self, size: int) -> int:
        return max(1, min(self.max_open_buckets, math.ceil(size / self.max_bucket_bytes)))

    def _open(self, prefix: str, count: int) -> list[tuple[Path, BinaryIO]]:
        buckets = []
        for index in range(count):
            path = self.workdir / f"{prefix}{index:04d}"
            buckets.append((path, open(path, "wb", buffering=1 << 16)))
        return buckets


def _bucket_of(dataset: str, prompt_id: str, salt: int, count: int) -> int:
    """A stable hash (not Python's, which changes per process): the same prompt, the same bucket."""
    digest = hashlib.blake2b(f"{dataset}\0{prompt_id}".encode(), digest_size=8, salt=salt.to_bytes(16, "big"))
    return int.from_bytes(digest.digest(), "big") % count
