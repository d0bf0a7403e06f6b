"""The records an export reads: a record's conversation, the filters, deduplication and a prompt's
samples.

The conversation every export format starts from: a completion record's prompt messages with the
generated assistant turn(s) put back where they were generated.

With `--regenerate all` the record's `messages` already hold the model's earlier replies (content
only, as the model saw them), and `turns` holds each reply's reasoning too.

Which records an export leaves out, and why (counted per reason in the manifest).

With `--regenerate all` a record is judged on every generated turn: one truncated or looped turn,
one turn without reasoning or with too little content fails the whole conversation, because a
trainer reads it as one sample. Samples (`--samples N`) are judged one by one: a prompt keeps the
samples that pass.

Which records export has seen, in a few bits each: the first complete record of a prompt wins.

A prompt id and its row index name the same prompt within a dataset (the producer rejects a second
row with a known id), so a per-dataset bitmap over rows dedupes by id at one bit per prompt: ten
million prompts cost 1.25 MB, where a set of id strings would cost about a gigabyte. The bitmap is
laid out like Redis's (most significant bit first) so reconciliation compares it with the run's
done bitmap byte for byte. Records written before `row` was recorded fall back to a set of 64-bit
id digests.

Samples (`--samples N`): the N records of one prompt, gathered by prompt for the formats that
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
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import Any, BinaryIO

from genfleet import ToolError
from genfleet.common import run_state

Message = dict[str, Any]
Record = dict[str, Any]


class FormatError(ToolError, ValueError):
    """A record this format cannot express; the message names the record."""


@dataclass(frozen=True)
class GeneratedTurn:
    reasoning: str
    content: str
    finish_reason: str
    matched_stop: int | str | list[int] | None
    output_ids: list[int] | None

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    def message(self) -> Message:
        message: Message = {"role": "assistant", "content": self.content}
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        return message


@dataclass(frozen=True)
class Conversation:
    id: str
    dataset: str
    messages: list[Message]  # prompt and generated turns, in order
    generated: tuple[int, ...]  # indices in `messages` of the generated assistant turns
    turns: tuple[GeneratedTurn, ...]  # the generated turns, in the same order


def generated_turns(record: Record) -> tuple[GeneratedTurn, ...]:
    if record.get("turns"):
        return tuple(GeneratedTurn(t["reasoning"], t["content"], t["finish_reason"], t.get("matched_stop"),
                                   t.get("output_ids")) for t in record["turns"])
    return (GeneratedTurn(record["reasoning"], record["content"], record["finish_reason"],
                          record.get("matched_stop"), record.get("output_ids")),)


def conversation_of(record: Record) -> Conversation:
    turns = generated_turns(record)
    messages = [dict(message) for message in record["messages"]]
    # The model's earlier replies sit in the prompt where it made them: every assistant turn after
    # the first user turn (workers/generation/replies.py `reply_positions`).
    earlier: list[int] = []
    seen_user = False
    for index, message in enumerate(messages if len(turns) > 1 else ()):
        seen_user = seen_user or message.get("role") == "user"
        if message.get("role") == "assistant" and seen_user:
            earlier.append(index)
    if len(earlier) != len(turns) - 1:
        raise FormatError(f"{record['id']}: {len(turns)} generated turns, but the prompt holds "
                          f"{len(earlier)} earlier replies")
    for index, turn in zip(earlier, turns, strict=False):
        messages[index] = turn.message()
    messages.append(turns[-1].message())
    return Conversation(record["id"], record["dataset"], messages, (*earlier, len(messages) - 1), turns)


TRUNCATED = "truncated"
LOOPED = "looped"
NO_REASONING = "no_reasoning"
SHORT_CONTENT = "short_content"


def looped(record: Record) -> bool:
    """The loop guard stopped or flagged a degenerate repetition (finish_reason "loop"): such text
    teaches a model to repeat itself."""
    if record.get("loop") is not None or record.get("finish_reason") == "loop":
        return True
    return any(turn.finish_reason == "loop" for turn in generated_turns(record))


@dataclass(frozen=True)
class RecordFilters:
    drop_truncated: bool = False  # finish_reason "length": cut at max_new_tokens
    require_reasoning: bool = False  # non-blank reasoning
    min_content_chars: int = 0  # content, stripped of surrounding whitespace
    drop_looped: bool = False  # finish_reason "loop": the loop guard's finding

    def rejection(self, record: Record) -> str | None:
        """The first reason to leave the record out, or None to keep it."""
        if not (self.drop_truncated or self.drop_looped or self.require_reasoning or self.min_content_chars):
            return None
        turns = generated_turns(record)
        if self.drop_truncated and any(turn.finish_reason == "length" for turn in turns):
            return TRUNCATED
        if self.drop_looped and looped(record):
            return LOOPED
        if self.require_reasoning and any(not turn.reasoning.strip() for turn in turns):
            return NO_REASONING
        if self.min_content_chars and any(len(turn.content.strip()) < self.min_content_chars for turn in turns):
            return SHORT_CONTENT
        return None


class RowBitmap:
    """A growable bitmap over row indices, bit order as in Redis's SETBIT."""

    def __init__(self) -> None:
        self._bits = bytearray()

    def test_and_set(self, row: int) -> bool:
        """Sets the row's bit; returns whether it was set before."""
        index, mask = run_state.locate(row)
        if index >= len(self._bits):
            self._bits.extend(bytes(max(index + 1, 2 * len(self._bits)) - len(self._bits)))
        was_set = bool(self._bits[index] & mask)
        self._bits[index] |= mask
        return was_set

    def to_bytes(self) -> bytes:
        return bytes(self._bits).rstrip(b"\0")


class SeenRecords:
    def __init__(self) -> None:
        self._rows: dict[str, RowBitmap] = {}
        self._digests: set[int] = set()
        self.without_row: dict[str, int] = {}  # per dataset: records that carry no row index

    def first_time(self, dataset: str, row: int | None, prompt_id: str) -> bool:
        """True the first time this prompt is seen."""
        if row is not None:
            bitmap = self._rows.get(dataset)
            if bitmap is None:
                bitmap = self._rows[dataset] = RowBitmap()
            return not bitmap.test_and_set(row)
        digest = int.from_bytes(hashlib.blake2b(prompt_id.encode(), digest_size=8).digest(), "big")
        if digest in self._digests:
            return False
        self._digests.add(digest)
        self.without_row[dataset] = self.without_row.get(dataset, 0) + 1
        return True

    def rows(self, dataset: str) -> bytes:
        """The bitmap of rows seen in `dataset`, trailing zero bytes dropped."""
        bitmap = self._rows.get(dataset)
        return bitmap.to_bytes() if bitmap is not None else b""


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
            for part_path, _ in parts:
                yield from self._drain_bucket(part_path, splits + 1)
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
