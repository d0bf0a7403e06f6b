"""Prompt ids (each record's `id`: docs/ARCHITECTURE.md, "The record contract"): `{dataset}/{key}`,
the key being the row's own `id` (or OpenAI Batch `custom_id`), else its 0-based row index. The
same input always yields the same ids."""
from __future__ import annotations

from typing import Any, NamedTuple

from genfleet.producer.conversations import RowRejected


class RowKey(NamedTuple):
    text: str
    own: bool  # the row brought it (`id` / `custom_id`), rather than its index


def row_key(data: dict[str, Any], row: int) -> RowKey:
    key = data.get("id")
    if key is None:
        key = data.get("custom_id")
    if key is None:
        return RowKey(str(row), False)
    if isinstance(key, bool) or not isinstance(key, (str, int)):
        raise RowRejected(f"id must be a string or an integer, got {type(key).__name__}")
    return RowKey(str(key), True)


def prompt_id(dataset: str, data: dict[str, Any], row: int) -> str:
    return f"{dataset}/{row_key(data, row).text}"


class DuplicateIds:
    """Remembers the keys seen in one pass over a dataset; the first row with a key wins.

    Every (re-)run reads the dataset from its start, so the same rows lose every time. Only the keys
    rows bring themselves are kept (index keys are unique by construction), so ids cost memory only
    when the dataset has its own.
    """

    def __init__(self) -> None:
        self._own_keys: set[str] = set()

    def is_duplicate(self, key: RowKey) -> bool:
        if not key.own:
            # An index key collides only with an earlier row whose own id is that number.
            return key.text in self._own_keys
        if key.text in self._own_keys:
            return True
        self._own_keys.add(key.text)
        return False
