"""`manifest.json`: what an export holds, where it came from, whether it is complete, and the
sha256 of every file written (all but the manifest itself), so a trainer can verify what it reads.

`complete` is false when the export stopped on an error or reconciliation found prompts without a
record; `verified` is true only when reconciliation against Redis ran and passed.

Per dataset, besides the counts: `looped`, `continued`, `regenerated` (of the unique records read,
before filters: the loop guard's findings, completions continued past a cut, completions asked again
with a larger budget) and `samples` (null without `--samples`; else the exported samples: `records`,
`prompts` they answer, and `per_prompt`, prompts by how many samples they kept, e.g. {"4": 998, "3": 2}),
`config`, the dataset's generation settings as the producer recorded them (sampling, max_new_tokens per
partition, ...; null without Redis), and `models`: the unique records (before filters) per model as the
workers recorded it, `{"model", "revision", "weight_version", "records"}`, most records first; `revision`
and `weight_version` are the server's own (`/server_info` `revision`, `/model_info` `weight_version`:
the record's `model_revision`), null where it did not report them or the records predate the field.
`genfleet_version` is the exporting genfleet's.
"""
from __future__ import annotations

import json
import os
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from genfleet.common.keys import ManifestFields
from genfleet.export.exporter import MANIFEST, MISSING
from genfleet.export.reconcile import RunLedger
from genfleet.export.report import DatasetTally, ExportReport
from genfleet.export.sinks import WrittenFile

MANIFEST_VERSION = 1
_COUNTS = ("input", "done", "dead", "rejected", "skipped")
_SUMMED = (*_COUNTS, "records", "duplicates_dropped", "filtered", "exported", "torn_lines", "looped", "continued",
           "regenerated")


def build_manifest(report: ExportReport, ledger: RunLedger | None, tokenizer_dir: str | None) -> dict[str, Any]:
    options = report.options
    config = ledger.config if ledger is not None else {}
    datasets: dict[str, dict[str, Any]] = {}
    for name in sorted(set(ledger.counts if ledger else {}) | set(report.tallies)):
        counts = ledger.counts.get(name) if ledger is not None else None
        tally = report.tallies.get(name) or DatasetTally()
        datasets[name] = {
            **{key: getattr(counts, key) if counts is not None else None for key in _COUNTS},
            "records": tally.records,
            "duplicates_dropped": tally.duplicates,
            "filtered": sum(tally.filtered.values()),
            "filtered_by_reason": dict(sorted(tally.filtered.items())),
            "exported": tally.exported,
            "torn_lines": tally.torn_lines,
            "looped": tally.looped,
            "continued": tally.continued,
            "regenerated": tally.regenerated,
            "samples": tally.samples_summary(),
            "config": (ledger.dataset_config(name) or None) if ledger is not None else None,
            "models": _models(tally),
        }
    models = sorted(model for model in report.models if model)
    return {
        "manifest_version": MANIFEST_VERSION,
        "run": options.run,
        "complete": report.complete,
        "verified": report.reconciliation is not None and report.complete,
        "problems": report.problems,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "genfleet_version": _genfleet_version(),
        "options": options.describe(),
        # A --from root without the run: a typo, or a host that wrote none of it.
        "sources_without_run": [str(source.resolve()) for source in options.sources
                                if not (source / options.run).is_dir()],
        "config_hash": ledger.manifest.get(ManifestFields.CONFIG_HASH) if ledger is not None else None,
        "model": models[0] if len(models) == 1 else models,
        "tokenizer": {
            "dir": tokenizer_dir or (ledger.manifest.get(ManifestFields.TOKENIZER_DIR) if ledger else None),
            "fingerprint": config.get("tokenizer"),
        },
        "reasoning_parser": config.get("reasoning_parser"),
        "datasets": datasets,
        "totals": {**{key: _sum(row.get(key) for row in datasets.values()) for key in _SUMMED},
                   "samples": _all_samples(report)},
        "torn_lines": [{"file": str(torn.path), "line": torn.line, "bytes": torn.size} for torn in report.torn],
        "duplicates": {"dropped": sum(t.duplicates for t in report.tallies.values()),
                       "examples": report.duplicate_examples},
        "reconciliation": _reconciliation(report),
        "stats": report.stats.summary(),
        "files": [file_entry(file, options.out) for file in report.files],
    }


def write_manifest(out: Path, manifest: dict[str, Any]) -> Path:
    """Written last and atomically: a manifest present is a manifest whole."""
    path = out / MANIFEST
    partial = path.with_suffix(".json.tmp")
    partial.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    os.replace(partial, path)
    return path


def file_entry(file: WrittenFile, out: Path) -> dict[str, Any]:
    """A written file as the manifest lists it."""
    return {"path": _relative(file.path, out), "records": file.records, "bytes": file.bytes, "sha256": file.sha256}


def _genfleet_version() -> str | None:
    try:
        return version("genfleet")  # the installed distribution's (pyproject.toml's)
    except PackageNotFoundError:  # run from a source tree that was never installed
        return None


def _reconciliation(report: ExportReport) -> dict[str, Any]:
    if report.reconciliation is None:
        return {"checked": False}
    return {
        "checked": True,
        "ok": all(finding.ok for finding in report.reconciliation),
        "missing_rows": report.missing_rows,
        "missing_file": MISSING if report.missing_rows else None,
        "datasets": {finding.dataset: finding.to_dict() for finding in report.reconciliation},
    }


def _models(tally: DatasetTally) -> list[dict[str, Any]]:
    return [{"model": model, "revision": revision, "weight_version": weight_version, "records": records}
            for (model, revision, weight_version), records in tally.models.most_common()]


def _all_samples(report: ExportReport) -> dict[str, Any] | None:
    every = DatasetTally()
    for tally in report.tallies.values():
        every.samples_per_prompt.update(tally.samples_per_prompt)
    return every.samples_summary()


def _sum(values: Any) -> int | None:
    present = [value for value in values if value is not None]
    return sum(present) if present else None


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)
