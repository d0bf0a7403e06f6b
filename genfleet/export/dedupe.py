"""Which records export has seen, in a few bits each: the first complete record of a prompt wins.

A prompt id and its row index name the same prompt within a dataset (the producer rejects a second
row with a known id), so a per-dataset bitmap over rows dedupes by id at one bit per prompt: ten
million prompts cost 1.25 MB, where a set of id strings would cost about a gigabyte. The bitmap is
laid out like Redis's (most significant bit first) so reconciliation compares it with the run's
done bitmap byte for byte. Records written before `row` was recorded fall back to a set of 64-bit
id digests.
"""
from __future__ import annotations

import hashlib

from genfleet.common import run_state


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
