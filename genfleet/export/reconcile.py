"""Proof that nothing went missing: the shards checked against the run's state in Redis.

Per dataset, two checks:
1. Every input row is settled: input (`total` published + `rejected`) = done + dead + rejected +
   skipped. Otherwise the rows still pending (enqueued, not done, not dead-lettered) are listed.
2. Every row whose done bit is set has a record in the shards (records carry their `row`). Rows
   skipped for a spent token budget have their done bit set too but no record, and Redis keeps no
   per-row mark of them, only their count: so the check passes when exactly `skipped` done rows lack
   a record, and otherwise lists every done row without one (at most `skipped` of which may be
   budget skips).

All of it reads bitmaps, never a key per prompt: a dataset of ten million rows costs a few
megabytes here. Redis knows rows, not ids; a missing row's id is given where the dataset's ids are
its row indices (`{dataset}/{row}`, every record seen says so), else left null.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from genfleet.common import run_state
from genfleet.common.keys import ManifestFields
from genfleet.common.run_state import DeadLetter, RunState
from genfleet.export.records import SeenRecords

EXAMPLES = 20  # missing rows shown per dataset in the manifest and on the console

DONE_WITHOUT_RECORD = "done_without_record"
PENDING = "pending"


@dataclass(frozen=True)
class DatasetCounts:
    """A dataset's settled counters, as the producer and the workers kept them."""
    total: int  # published to a queue
    done: int
    dead: int
    rejected: int
    skipped: int

    @property
    def input(self) -> int:
        return self.total + self.rejected

    @property
    def pending(self) -> int:
        return self.input - self.done - self.dead - self.rejected - self.skipped


@dataclass
class RunLedger:
    """What Redis says about a run: its manifest, per-dataset counters and dead letters."""
    run: str
    manifest: dict[str, str]
    counts: dict[str, DatasetCounts]
    dead_letters: list[DeadLetter]

    @classmethod
    def read(cls, state: RunState) -> RunLedger:
        counts = {}
        for dataset in state.datasets():
            c = state.counters(dataset)
            counts[dataset] = DatasetCounts(total=c["total"], done=c["done"], dead=c["failed"],
                                            rejected=c["rejected"], skipped=c["skipped"])
        return cls(state.run, state.manifest(), counts, state.read_dead_letters())

    @property
    def config(self) -> dict[str, Any]:
        raw = self.manifest.get(ManifestFields.CONFIG)
        return json.loads(raw) if raw else {}

    def dataset_config(self, dataset: str) -> dict[str, Any]:
        raw = self.manifest.get(ManifestFields.dataset_config(dataset))
        return json.loads(raw) if raw else {}

    def chat_template_kwargs(self) -> dict[str, dict[str, Any]]:
        return {name: self.dataset_config(name).get("chat_template_kwargs", {}) for name in self.counts}


@dataclass(frozen=True)
class MissingRow:
    dataset: str
    row: int
    id: str | None
    reason: str  # DONE_WITHOUT_RECORD or PENDING

    def to_dict(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "row": self.row, "id": self.id, "reason": self.reason}


@dataclass
class DatasetReconciliation:
    dataset: str
    counts: DatasetCounts | None  # None: the shards hold a dataset Redis does not know
    records: int  # unique records in the shards
    done_bits: int = 0
    done_without_record: int = 0
    pending_rows: int = 0
    records_not_done: int = 0  # records whose done bit is not set (written, task never acknowledged)
    records_without_row: int = 0
    problems: list[str] = field(default_factory=list)  # data may be missing: the export is incomplete
    notes: list[str] = field(default_factory=list)  # worth knowing, nothing missing
    examples: list[MissingRow] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "problems": self.problems, "notes": self.notes, "records": self.records,
            "done_bits": self.done_bits, "done_without_record": self.done_without_record,
            "pending_rows": self.pending_rows,
            "records_not_done": self.records_not_done, "records_without_row": self.records_without_row,
            "missing_examples": [row.to_dict() for row in self.examples],
        }


class Reconciler:
    def __init__(self, state: RunState, ledger: RunLedger) -> None:
        self.state, self.ledger = state, ledger

    def run(self, seen: SeenRecords, records: dict[str, int], index_keyed: dict[str, bool],
            on_missing: Callable[[MissingRow], None]) -> list[DatasetReconciliation]:
        """Findings per dataset (Redis's and the shards'); each missing row goes to `on_missing`."""
        dead_rows: dict[str, set[int]] = {}
        for letter in self.ledger.dead_letters:
            dead_rows.setdefault(letter.payload.dataset, set()).add(letter.payload.row)
        findings = []
        for dataset in sorted(set(self.ledger.counts) | set(records)):
            finding = DatasetReconciliation(dataset, self.ledger.counts.get(dataset), records.get(dataset, 0),
                                            records_without_row=seen.without_row.get(dataset, 0))
            self._check(finding, seen.rows(dataset), dead_rows.get(dataset, set()),
                        index_keyed.get(dataset, False), on_missing)
            findings.append(finding)
        return findings

    def _bitmap(self, key: str) -> bytes:
        value = self.state.redis.get(key)
        if value is None:
            return b""
        if not isinstance(value, bytes):  # a bitmap is binary: a decoding client would mangle it
            raise TypeError(f"{key} was read as text: reconcile needs a Redis client without decode_responses")
        return value

    def _check(self, finding: DatasetReconciliation, seen_bits: bytes, dead: set[int], index_keyed: bool,
               on_missing: Callable[[MissingRow], None]) -> None:
        dataset, counts = finding.dataset, finding.counts
        if counts is None:
            finding.problems.append(f"{dataset}: the shards hold {finding.records} records of a dataset the run "
                                    "in Redis does not have")
            return
        if finding.records_without_row:
            finding.problems.append(f"{dataset}: {finding.records_without_row} records carry no row index, so "
                                    "they cannot be matched to the done bitmap (written before rows were "
                                    "recorded?); export with --no-reconcile")
        done = self._bitmap(self.state.keys.done(dataset))
        enqueued = self._bitmap(self.state.keys.enqueued(dataset))
        width = max(len(done), len(enqueued), len(seen_bits))
        done_bits, seen, queued = (run_state.to_int(bits, width) for bits in (done, seen_bits, enqueued))
        finding.done_bits = done_bits.bit_count()
        finding.records_not_done = (seen & ~done_bits).bit_count()

        def report(row: int, reason: str) -> None:
            missing = MissingRow(dataset, row, f"{dataset}/{row}" if index_keyed else None, reason)
            if len(finding.examples) < EXAMPLES:
                finding.examples.append(missing)
            on_missing(missing)

        unrecorded = done_bits & ~seen
        finding.done_without_record = unrecorded.bit_count()
        if finding.done_without_record > counts.skipped:
            for row in run_state.set_rows(run_state.from_int(unrecorded, width)):
                report(row, DONE_WITHOUT_RECORD)
        elif finding.done_without_record:
            finding.notes.append(f"{dataset}: {finding.done_without_record} done rows without a record: the "
                                 f"prompts skipped for the token budget ({counts.skipped} counted)")
        for row in run_state.set_rows(run_state.from_int(queued & ~done_bits, width)):
            if row not in dead:
                finding.pending_rows += 1
                report(row, PENDING)

        if counts.pending or finding.pending_rows:
            finding.problems.append(
                f"{dataset}: input {counts.input} ≠ done {counts.done} + dead {counts.dead} + rejected "
                f"{counts.rejected} + skipped {counts.skipped}: {counts.pending} prompts not settled "
                f"({finding.pending_rows} rows enqueued and neither done nor dead): is the run finished?")
        if finding.done_without_record > counts.skipped:
            budget = (f"; {counts.skipped} of them may be prompts skipped for the token budget (Redis counts "
                      "those but does not mark which rows)") if counts.skipped else ""
            finding.problems.append(
                f"{dataset}: {finding.done_without_record} rows are done in Redis but have no record in the "
                f"shards{budget}")
        # Any count that disagrees makes the export unverified: a record for a prompt Redis does not
        # hold as done (its task failed after writing, or still runs) is data the run never settled.
        if finding.done_bits != counts.done + counts.skipped:
            finding.problems.append(f"{dataset}: {finding.done_bits} done bits, but the counters say done "
                                    f"{counts.done} + skipped {counts.skipped}")
        if finding.records_not_done:
            finding.problems.append(f"{dataset}: {finding.records_not_done} records whose prompt is not marked "
                                    "done (written, then the task failed or is still running); exported all the "
                                    "same")
