"""What an export was asked to do (`ExportOptions`) and what it found (`ExportReport`, a
`DatasetTally` per dataset): plain data the exporter fills and the manifest reads.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from genfleet.common.shards import TornLine
from genfleet.export.conversation import Record
from genfleet.export.features import LineFeatures
from genfleet.export.filters import RecordFilters, looped
from genfleet.export.reconcile import DatasetReconciliation
from genfleet.export.sinks import WrittenFile
from genfleet.export.stats import RunStats


@dataclass(frozen=True)
class ExportOptions:
    run: str
    sources: tuple[Path, ...]
    out: Path
    format: str
    filters: RecordFilters = field(default_factory=RecordFilters)
    shuffle: bool = False
    seed: int = 0
    max_records_per_file: int | None = None
    per_dataset: bool = True
    merged: bool = True
    # Memory for one bucket read back from disk: the shuffle's, and sample grouping's.
    shuffle_buffer_bytes: int = 256 << 20

    def describe(self) -> dict[str, Any]:
        return {
            "format": self.format, "sources": [str(source.resolve()) for source in self.sources],
            "drop_truncated": self.filters.drop_truncated, "drop_looped": self.filters.drop_looped,
            "require_reasoning": self.filters.require_reasoning,
            "min_content_chars": self.filters.min_content_chars, "shuffle": self.shuffle,
            "seed": self.seed if self.shuffle else None, "max_records_per_file": self.max_records_per_file,
            "per_dataset": self.per_dataset, "merged": self.merged,
        }


@dataclass
class DatasetTally:
    """What the shards held for one dataset, and what became of it."""
    records: int = 0  # unique records read
    duplicates: int = 0
    filtered: Counter[str] = field(default_factory=Counter)
    exported: int = 0  # records exported (each sample counts: a grouped line holds several)
    torn_lines: int = 0
    # Every record's id is `{dataset}/{row}`: the dataset has no ids of its own, so a missing
    # row's id is known too.
    index_keyed: bool = True
    # Of the unique records read (before filters): what the loop guard and truncation handling did.
    looped: int = 0
    continued: int = 0
    regenerated: int = 0
    # Exported samples per prompt (`--samples N`): samples in a prompt -> prompts; empty without samples.
    samples_per_prompt: Counter[int] = field(default_factory=Counter)
    # Unique records per (model, revision, weight version) as the workers recorded them (`model_revision`).
    models: Counter[tuple[str, str | None, str | None]] = field(default_factory=Counter)

    def count_kind(self, record: Record) -> None:
        self.looped += looped(record)
        self.continued += bool(record.get("continued"))
        self.regenerated += bool(record.get("regenerated"))
        served = record.get("model_revision") or {}
        model = (record.get("model") or "", served.get("revision"), served.get("weight_version"))
        if model in self.models or len(self.models) < 100:  # a few per run; never unbounded
            self.models[model] += 1

    def samples_summary(self) -> dict[str, Any] | None:
        """{"records", "prompts", "per_prompt": {samples: prompts}}; None where nothing was sampled."""
        if not self.samples_per_prompt:
            return None
        per_prompt = self.samples_per_prompt
        return {"records": sum(size * prompts for size, prompts in per_prompt.items()),
                "prompts": sum(per_prompt.values()),
                "per_prompt": {str(size): per_prompt[size] for size in sorted(per_prompt)}}


@dataclass
class ExportReport:
    options: ExportOptions
    tallies: dict[str, DatasetTally] = field(default_factory=dict)
    stats: RunStats = field(default_factory=RunStats)
    models: Counter[str] = field(default_factory=Counter)
    torn: list[TornLine] = field(default_factory=list)
    duplicate_examples: list[dict[str, Any]] = field(default_factory=list)
    files: list[WrittenFile] = field(default_factory=list)
    reconciliation: list[DatasetReconciliation] | None = None  # None: not checked
    missing_rows: int = 0
    error: str | None = None
    histogram: bool = False  # stats.png written
    # The shape of every line written, per dataset: its lines and its error file's (the card's features).
    features: LineFeatures = field(default_factory=LineFeatures)
    error_features: LineFeatures = field(default_factory=LineFeatures)

    def tally(self, dataset: str) -> DatasetTally:
        tally = self.tallies.get(dataset)
        if tally is None:
            tally = self.tallies[dataset] = DatasetTally()
        return tally

    @property
    def problems(self) -> list[str]:
        found = [self.error] if self.error else []
        for finding in self.reconciliation or []:
            found += finding.problems
        return found

    @property
    def complete(self) -> bool:
        return not self.problems
