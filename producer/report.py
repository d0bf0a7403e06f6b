"""What enqueueing (or a dry run of) one dataset found: counts per outcome and partition, rejections
with file, line and reason, prompt-token statistics and the bytes the queued messages take."""
from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import dataclass, field
from statistics import median

from genfleet.common.queues import PARTITIONS
from genfleet.common.run_state import RowRejection

# Every rejection is counted; only this many are kept to show (a broken file may have millions).
KEPT_REJECTIONS = 1000


@dataclass(frozen=True)
class TokenStats:
    count: int
    min: int
    median: float
    mean: float
    p99: int
    max: int

    @classmethod
    def of(cls, values: array) -> TokenStats | None:
        if not values:
            return None
        ordered = sorted(values)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        return cls(len(ordered), ordered[0], median(ordered), sum(ordered) / len(ordered), p99, ordered[-1])


@dataclass
class DatasetReport:
    dataset: str
    run: str
    enqueued: dict[str, int] = field(default_factory=lambda: {p: 0 for p in PARTITIONS})
    already_queued: int = 0  # enqueued by an earlier run, not done yet
    already_done: int = 0  # done by an earlier run: skipped
    duplicates: int = 0  # a later row with an id seen before; also counted in `rejected`
    rejected: int = 0
    rejected_by_kind: Counter = field(default_factory=Counter)
    rejections: list[RowRejection] = field(default_factory=list)
    rows_read: int = 0
    cut_at_max_prompts: bool = False
    # Per partition, of the prompts accepted in this pass (what was or would be enqueued).
    prompt_tokens: dict[str, array] = field(default_factory=lambda: {p: array("I") for p in PARTITIONS})
    message_bytes: dict[str, int] = field(default_factory=lambda: {p: 0 for p in PARTITIONS})

    @property
    def total_enqueued(self) -> int:
        return sum(self.enqueued.values())

    def reject(self, rejection: RowRejection, kind: str) -> None:
        self.rejected += 1
        self.rejected_by_kind[kind] += 1
        if kind == "duplicate id":
            self.duplicates += 1
        if len(self.rejections) < KEPT_REJECTIONS:
            self.rejections.append(rejection)

    def token_stats(self, partition: str) -> TokenStats | None:
        return TokenStats.of(self.prompt_tokens[partition])


def rejection_kind(reason: str) -> str:
    """The reason without its particulars, to count rejections by cause."""
    for prefix in ("invalid JSON", "invalid UTF-8", "prompt too long", "duplicate id", "no user turn"):
        if reason.startswith(prefix):
            return prefix
    return "malformed row"
