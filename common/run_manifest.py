"""A run's manifest hash and datasets set: the only module that writes them.

The manifest is a contract between processes: the producer records what config a run was enqueued
with (`producer/manifest.py` decides what is hashed and refuses a changed config), workers read a
dataset's token budget, `status` the run's start, export the tokenizer and the config hash. So its
writer lives here beside the field names (`common/keys.py`'s `ManifestFields`), not in the producer.

Every field but `successor` is written once (HSETNX): a re-run never rewrites history.
"""
from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

import redis

from genfleet.common.keys import ManifestFields, RunKeys


class RunManifest:
    def __init__(self, client: redis.Redis, run: str) -> None:
        self.redis, self.run = client, run
        self.keys = RunKeys(run)

    # --- writers ---------------------------------------------------------------------------
    def record(self, fields: Mapping[str, str | int | float], datasets: Iterable[str]) -> None:
        """Writes each field the first time it is seen (with the run's `created_at`), and adds the
        datasets, in one transaction; never overwrites."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hsetnx(self.keys.manifest, ManifestFields.CREATED_AT, time.time())
        for name, value in fields.items():
            pipe.hsetnx(self.keys.manifest, name, value)
        names = list(datasets)
        if names:
            pipe.sadd(self.keys.datasets, *names)
        pipe.execute()

    def register_dataset(self, dataset: str, source: str) -> None:
        """A dataset and where it was read from, without a config (tools that seed a run by hand)."""
        self.record({ManifestFields.source(dataset): source}, [dataset])

    def mark_superseded(self, successor: str) -> None:
        """`enqueue --new-run`: the run that replaced this one (the one field that may change)."""
        self.redis.hset(self.keys.manifest, ManifestFields.SUCCESSOR, successor)

    # --- readers ---------------------------------------------------------------------------
    def fields(self) -> dict[str, str]:
        return {_text(k): _text(v) for k, v in self.redis.hgetall(self.keys.manifest).items()}

    def budget(self, dataset: str) -> int | None:
        """The dataset's completion-token budget as the producer recorded it (None: no budget)."""
        value = self.redis.hget(self.keys.manifest, ManifestFields.budget(dataset))
        return int(value) if value is not None else None

    def datasets(self) -> list[str]:
        return sorted(_text(name) for name in self.redis.smembers(self.keys.datasets))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
