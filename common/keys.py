"""Every Redis key genfleet uses, built in one place. All of a run's keys start with `genfleet:{run}:`."""
from __future__ import annotations

from dataclasses import dataclass

PREFIX = "genfleet"


@dataclass(frozen=True)
class RunKeys:
    run: str

    @property
    def base(self) -> str:
        return f"{PREFIX}:{self.run}"

    @property
    def manifest(self) -> str:
        """Hash: run config (tokenizer, parser, config hash, created_at)."""
        return f"{self.base}:manifest"

    @property
    def datasets(self) -> str:
        """Set: names of the run's datasets."""
        return f"{self.base}:datasets"

    def counters(self, dataset: str) -> str:
        """Hash: per-dataset counters (total, done, failed, tokens, ...)."""
        return f"{self.base}:counters:{dataset}"

    def enqueued(self, dataset: str) -> str:
        """Bitmap over row indices: the prompt was published once (makes enqueue idempotent)."""
        return f"{self.base}:enqueued:{dataset}"

    def done(self, dataset: str) -> str:
        """Bitmap over row indices: the record is durably on disk."""
        return f"{self.base}:done:{dataset}"

    def rejected(self, dataset: str) -> str:
        """Hash: row index -> JSON {file, line, reason} for rows refused at enqueue."""
        return f"{self.base}:rejected:{dataset}"

    @property
    def dead_letters(self) -> str:
        """Hash: prompt id -> msgpack dead letter (payload, error class, message, attempts, ...)."""
        return f"{self.base}:dead"
