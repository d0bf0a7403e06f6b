"""The run manifest: what config a run's prompts were enqueued with, so a re-run cannot quietly mix
two configs in one run. A re-run with a different config is refused, unless `--new-run`, which
enqueues into a fresh run named after the config instead (`{run}-cfg{hash8}`). A run that never
published a prompt (every row rejected) holds nothing to mix: its config gives way to the new one.

Hashed (a change means different completions): the tokenizer's files (model identity and chat
template), the reasoning parser, `regenerate`, `keep_token_ids`; per dataset its row format and
prompt field, sampling, max_new_tokens, chat template kwargs and token budget. Not hashed (a re-run
may change them): paths, partition pins and threshold, context length and rule, `max_prompts`,
queue depth, batch size.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from genfleet.common.keys import ManifestFields
from genfleet.common.run_state import RunManifest
from genfleet.producer import ProducerError
from genfleet.producer.run_config import RunConfig

# Files that define how text becomes tokens: never the weights.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json",
                   "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt",
                   "tokenizer.model", "tiktoken.model", "config.json", "generation_config.json")


class ConfigChanged(ProducerError):
    """The run exists with another config; the message lists the differences and the way out."""


def tokenizer_fingerprint(directory: str | Path) -> str:
    digest = hashlib.sha256()
    root = Path(directory)
    for name in TOKENIZER_FILES:
        path = root / name
        if path.is_file():
            digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def config_hash(identity: dict[str, Any]) -> str:
    return hashlib.sha256(_canonical(identity).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RunIdentity:
    """The hashed part of a run's config, run-wide and per dataset."""
    run: dict[str, Any]
    datasets: dict[str, dict[str, Any]]

    @classmethod
    def of(cls, config: RunConfig, tokenizer_id: str) -> RunIdentity:
        return cls({**config.identity(), "tokenizer": tokenizer_id},
                   {dataset.name: dataset.identity() for dataset in config.datasets})

    def new_run_name(self, run: str) -> str:
        """Deterministic: the same command with `--new-run` again resumes the same new run."""
        return f"{run}-cfg{config_hash({'run': self.run, 'datasets': self.datasets})[:8]}"


class Manifest:
    """The producer's view of a run's manifest: what to record and how a re-run differs. The hash
    itself is written by `common/run_state.py`."""

    def __init__(self, client: redis.Redis, run: str) -> None:
        self.run = run
        self.store = RunManifest(client, run)

    def differences(self, identity: RunIdentity) -> list[str]:
        """How `identity` differs from what the run was enqueued with, one line per setting."""
        stored = self.store.fields()
        lines: list[str] = []
        if ManifestFields.CONFIG in stored:
            lines += _diff("", json.loads(stored[ManifestFields.CONFIG]), identity.run)
        for name, dataset_identity in identity.datasets.items():
            recorded = stored.get(ManifestFields.dataset_config(name))
            if recorded is not None:
                lines += _diff(f"{name}.", json.loads(recorded), dataset_identity)
        return lines

    def record(self, config: RunConfig, identity: RunIdentity, predecessor: str | None = None) -> None:
        """Writes the config the first time the run (or a dataset of it) is seen; never overwrites."""
        fields: dict[str, str | int] = {
            ManifestFields.CONFIG: _canonical(identity.run),
            ManifestFields.CONFIG_HASH: config_hash(identity.run),
            ManifestFields.TOKENIZER_DIR: config.tokenizer,
            ManifestFields.TRUST_REMOTE_CODE: int(config.trust_remote_code),
        }
        if predecessor:
            fields[ManifestFields.PREDECESSOR] = predecessor
        for dataset in config.datasets:
            dataset_identity = identity.datasets[dataset.name]
            fields[ManifestFields.source(dataset.name)] = dataset.source
            fields[ManifestFields.dataset_config(dataset.name)] = _canonical(dataset_identity)
            fields[ManifestFields.dataset_config_hash(dataset.name)] = config_hash(dataset_identity)
            if dataset.max_tokens_per_dataset is not None:
                fields[ManifestFields.budget(dataset.name)] = dataset.max_tokens_per_dataset
        self.store.record(fields, [dataset.name for dataset in config.datasets])

    def mark_superseded(self, successor: str) -> None:
        self.store.mark_superseded(successor)


def resolve_run(client: redis.Redis, config: RunConfig, identity: RunIdentity, *, new_run: bool) -> str:
    """The run to enqueue into: the requested one if its config matches (or it is new); with
    `new_run`, a fresh run named after the config when it does not; otherwise `ConfigChanged`."""
    manifest = Manifest(client, config.run)
    differences = manifest.differences(identity)
    if not differences:
        return config.run
    if manifest.store.forget_if_unpublished():
        # Every row of the earlier command was rejected (e.g. too long for the context): nothing
        # under its config exists, so the corrected command takes the name.
        return config.run
    fresh = identity.new_run_name(config.run)
    if not new_run:
        listed = "\n  ".join(differences)
        raise ConfigChanged(
            f"run {config.run!r} was enqueued with a different config:\n  {listed}\n"
            f"Re-run with the original settings to resume it, or pass --new-run to enqueue into the "
            f"fresh run {fresh!r} (run {config.run!r} keeps its queued prompts and outputs).")
    later = Manifest(client, fresh).differences(identity)
    if later:  # only with a hash collision or a hand-edited manifest
        raise ConfigChanged(f"run {fresh!r} exists with a different config too:\n  " + "\n  ".join(later))
    return fresh


def _diff(prefix: str, before: Any, after: Any) -> list[str]:
    if isinstance(before, dict) and isinstance(after, dict):
        lines = []
        for key in sorted(set(before) | set(after)):
            lines += _diff(f"{prefix}{key}.", before.get(key, _MISSING), after.get(key, _MISSING))
        return lines
    if before == after:
        return []
    return [f"{prefix.rstrip('.')}: was {_show(before)}, now {_show(after)}"]


class _Missing:
    def __repr__(self) -> str:
        return "unset"


_MISSING = _Missing()


def _show(value: Any) -> str:
    return "unset" if value is _MISSING or value is None else json.dumps(value)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
