"""The dataset card, `README.md` in the export directory: the Hugging Face ecosystem loads the export
as it is (`datasets.load_dataset(<export dir>)`, or the Hub once the folder is pushed).

Front matter, rendered by huggingface_hub's `DatasetCardData` and `DatasetCard` (huggingface_hub
2.4.0 `repocard_data.py`, `repocard.py`: unknown keys such as `configs` and `dataset_info` pass
through as given, None values are dropped):
- `configs`: `all`, the default, with every dataset's lines (the merged files, or with
  `--no-merged` every dataset's files); one per dataset (named after it, `{name}-dataset` where that
  would clash with `all` or `errors`); `errors`, openai-batch's dead letters, where any were written.
  Each is one `train` split listing exactly the files written, never a glob: `manifest.json` and
  `missing.jsonl` are never read as data.
- `dataset_info`: per config, the features of every line written (`features.py`), the split's line
  count (datasets checks it on load, datasets 5.2.0 `utils/info_utils.py` `verify_splits`) and bytes
  (of the JSONL, not of Arrow), and `download_size`.
- `size_categories` from the default config's lines; `tags: [synthetic]`. No license: the export
  cannot know the terms of the prompts' sources or of the model.
The body is the provenance (`card_body.py`), read from the manifest, the one owner of the numbers.

huggingface_hub comes with transformers (a core dependency), so the card needs no `datasets`.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from genfleet.export.card_body import card_body
from genfleet.export.features import Struct, features_yaml, uses_json
from genfleet.export.manifest import build_manifest, file_entry, write_manifest
from genfleet.export.reconcile import RunLedger
from genfleet.export.report import ExportReport
from genfleet.export.sinks import WrittenFile

CARD = "README.md"
MERGED_CONFIG = "all"
ERRORS_CONFIG = "errors"
SPLIT = "train"
# datasets' own buckets (huggingface_hub 2.4.0 `DatasetCardData` docstring), by upper bound.
_SIZE_CATEGORIES = ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"),
                    (10_000_000, "1M<n<10M"), (100_000_000, "10M<n<100M"), (1_000_000_000, "100M<n<1B"),
                    (10_000_000_000, "1B<n<10B"))


def config_name(dataset: str) -> str:
    """A dataset's config: its name, unless that is one of the export's own configs."""
    return f"{dataset}-dataset" if dataset in (MERGED_CONFIG, ERRORS_CONFIG) else dataset


@dataclass(frozen=True)
class CardConfig:
    name: str
    dataset: str | None  # None: every dataset
    default: bool
    files: list[WrittenFile]
    features: Struct

    @property
    def lines(self) -> int:
        return sum(file.records for file in self.files)

    @property
    def bytes(self) -> int:
        return sum(file.bytes for file in self.files)


def write_card(out: Path, report: ExportReport, manifest: dict[str, Any]) -> WrittenFile:
    """Writes `README.md` into `out`; returns it, hashed, for the manifest's file list."""
    from huggingface_hub import DatasetCard, DatasetCardData

    configs = card_configs(report)
    default_lines = sum(config.lines for config in configs if config.default)
    data = DatasetCardData(
        pretty_name=f"genfleet run {manifest['run']}",
        size_categories=size_category(default_lines) if configs else None,
        tags=["synthetic"],
        configs=[_config_yaml(config, out) for config in configs] or None,
        dataset_info=[_info_yaml(config) for config in configs] or None,
    )
    names = {config.dataset: config.name for config in configs if config.dataset is not None}
    body = card_body(manifest, names, errors=any(config.name == ERRORS_CONFIG for config in configs),
                     json_fields=any(uses_json(config.features) for config in configs))
    path = out / CARD
    DatasetCard(f"---\n{data.to_yaml()}\n---\n\n{body}").save(path)
    written = path.read_bytes()
    return WrittenFile(path, 0, len(written), hashlib.sha256(written).hexdigest())


def size_category(lines: int) -> str:
    for bound, category in _SIZE_CATEGORIES:
        if lines < bound:
            return category
    return "n>10B"


def card_configs(report: ExportReport) -> list[CardConfig]:
    """The default config first, then one per dataset, then the dead letters; only those with files."""
    data = [file for file in report.files if file.series is not None and not file.series.errors]
    errors = [file for file in report.files if file.series is not None and file.series.errors]
    configs = []
    merged = [file for file in data if file.series.dataset is None] or data  # --no-merged: every dataset's
    if merged:
        configs.append(CardConfig(MERGED_CONFIG, None, True, merged, report.features.every()))
    for dataset in sorted({file.series.dataset for file in data if file.series.dataset is not None}):
        files = [file for file in data if file.series.dataset == dataset]
        configs.append(CardConfig(config_name(dataset), dataset, False, files, report.features.of([dataset])))
    merged_errors = [file for file in errors if file.series.dataset is None] or errors
    if merged_errors:
        configs.append(CardConfig(ERRORS_CONFIG, None, False, merged_errors, report.error_features.every()))
    return configs


def _config_yaml(config: CardConfig, out: Path) -> dict[str, Any]:
    paths = [file.path.relative_to(out).as_posix() for file in config.files]
    entry: dict[str, Any] = {"config_name": config.name}
    if config.default:
        entry["default"] = True
    entry["data_files"] = [{"split": SPLIT, "path": paths[0] if len(paths) == 1 else paths}]
    return entry


def _info_yaml(config: CardConfig) -> dict[str, Any]:
    return {"config_name": config.name, "features": features_yaml(config.features),
            "splits": [{"name": SPLIT, "num_bytes": config.bytes, "num_examples": config.lines}],
            "download_size": config.bytes}


def write_card_and_manifest(report: ExportReport, ledger: RunLedger | None, tokenizer_dir: str | None) -> None:
    """The export's last step: the card (not when the export stopped on an error: what was written is no
    dataset), listed in the manifest, then the manifest itself."""
    out = report.options.out
    manifest = build_manifest(report, ledger, tokenizer_dir)
    if report.error is None:
        manifest["files"].append(file_entry(write_card(out, report, manifest), out))
    write_manifest(out, manifest)
