"""The one codec for a run's bitmaps over row indices (`enqueued`, `done`, and export's seen rows).

Redis numbers a string's bits from the most significant bit of its first byte: "thinking of the
string as an array of bits from left to right, where the first byte's most significant bit is at
position 0, the second byte's most significant bit is at position 8, and so forth. The same bit
position convention is followed by GETBIT and SETBIT" (https://redis.io/commands/bitpos, and
https://redis.io/commands/setbit). So row `r` is bit `0x80 >> (r % 8)` of byte `r // 8`; a missing
key reads as an empty string, i.e. no row set. Every place that decodes such a bitmap read with GET
or GETRANGE goes through here, so the bit order is written down once.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

# Byte value -> the bit positions (0 = most significant) set in it: decoding then costs one table
# lookup per non-zero byte instead of eight tests.
_SET_POSITIONS: tuple[tuple[int, ...], ...] = tuple(
    tuple(bit for bit in range(8) if value & (0x80 >> bit)) for value in range(256))


def locate(row: int) -> tuple[int, int]:
    """(byte index, mask within that byte) of `row`'s bit."""
    return row >> 3, 0x80 >> (row & 7)


def is_set(bitmap: bytes, row: int, *, first_byte: int = 0) -> bool:
    """Whether `row` is set in `bitmap`, which holds the bytes from `first_byte` on (a GETRANGE)."""
    index, mask = locate(row)
    offset = index - first_byte
    return 0 <= offset < len(bitmap) and bool(bitmap[offset] & mask)


def set_rows(bitmap: bytes, *, first_byte: int = 0) -> Iterator[int]:
    """The rows set in `bitmap` (bytes from `first_byte` on), in increasing order."""
    for index, value in enumerate(bitmap, start=first_byte):
        if value:
            base = index * 8
            for bit in _SET_POSITIONS[value]:
                yield base + bit


def to_int(bitmap: bytes, width: int) -> int:
    """`bitmap` padded to `width` bytes as one integer, row 0 its most significant bit: whole-bitmap
    AND / AND NOT / popcount (`int.bit_count`) in C instead of a loop over rows."""
    return int.from_bytes(bitmap.ljust(width, b"\0"), "big")


def from_int(bits: int, width: int) -> bytes:
    """The inverse of `to_int`: the `width`-byte bitmap whose bits are those of `bits`."""
    return bits.to_bytes(width, "big")


def from_rows(rows: Iterable[int]) -> bytes:
    """The bitmap with exactly `rows` set (what SETBIT on each would leave), as short as it can be."""
    rows = list(rows)
    if not rows:
        return b""
    width = (max(rows) >> 3) + 1
    bits = 0
    for row in rows:
        bits |= 1 << (width * 8 - 1 - row)
    return from_int(bits, width)
