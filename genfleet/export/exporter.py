"""The exporter: what it was asked and found (its report), the pass over the shards, and the manifest
it writes.

What an export was asked to do (`ExportOptions`) and what it found (`ExportReport`, a
`DatasetTally` per dataset): plain data the exporter fills and the manifest reads.

`genfleet export`: a run's shards, from one or several output roots, become one clean dataset.

One streaming pass: read each shard line → keep the first record of each prompt → count it in the
stats → filter → format → write (or, with `--shuffle`, spill to random buckets and write after).
Samples (`--samples N`) of the formats that write a line per prompt are spilled to disk by prompt
instead and written, one line per prompt, after the pass (`samples`). Memory holds one record at a
time plus a bit per prompt (dedupe), a count per distinct completion length (stats) and, when
shuffling or grouping samples, one bucket; it does not grow with the number of records.
Then the dead letters (openai-batch's error file), reconciliation against Redis, the stats and
`manifest.json`, which says whether the export is complete and hashes every file written.

`manifest.json`: what an export holds, where it came from, whether it is complete, and the
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

import hashlib
import json
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Protocol

from genfleet import ToolError
from genfleet.common.keys import ManifestFields
from genfleet.common.shards import Shard, ShardError, ShardLine, ShardReader, TornLine, find_shards
from genfleet.export.features import LineFeatures
from genfleet.export.formats import FORMATS, RecordFormatter
from genfleet.export.reconcile import DatasetReconciliation, MissingRow, Reconciler, RunLedger
from genfleet.export.records import FormatError, Record, RecordFilters, SampleGroups, SeenRecords, looped, prompt_id_of
from genfleet.export.sinks import BucketShuffle, HashedFile, OutputFiles, WrittenFile
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


MANIFEST = "manifest.json"
MISSING = "missing.jsonl"
STATS_PNG = "stats.png"
DUPLICATE_EXAMPLES = 20


class ExportError(ToolError):
    """The export cannot go on (a corrupt shard, a record its format cannot express, no shards);
    the message names the file and line or the directory."""


class Progress(Protocol):
    def phase(self, description: str, total: int | None) -> None: ...

    def advance(self, amount: int) -> None: ...


class _NoProgress:
    def phase(self, description: str, total: int | None) -> None:
        pass

    def advance(self, amount: int) -> None:
        pass


class Exporter:
    def __init__(self, options: ExportOptions, formatter: RecordFormatter, *, ledger: RunLedger | None = None,
                 reconciler: Reconciler | None = None, progress: Progress | None = None) -> None:
        self.options = options
        self.formatter = formatter
        self.ledger = ledger
        self.reconciler = reconciler
        self.progress = progress or _NoProgress()
        self.report = ExportReport(options)
        self._grouping = FORMATS[options.format].samples  # None: a line per sample
        self._samples: SampleGroups | None = None  # the read pass's, while it runs

    def run(self, write_manifest: Callable[[ExportReport], object]) -> ExportReport:
        """Exports, reconciles and writes the manifest (also when it stops on an error, marked
        incomplete, before re-raising the error)."""
        options = self.options
        _prepare_out(options.out)
        try:
            shards = find_shards(options.sources, options.run)
            if not shards:
                places = ", ".join(str(source / options.run) for source in options.sources)
                raise ExportError(f"no shards of run {options.run!r} in {places}")
            seen = SeenRecords()
            self._export(shards, seen)
            self._write_dead_letters()
            if self.reconciler is not None:
                self._reconcile(seen)
            self.progress.phase("plotting stats", None)
            self.report.histogram = self.report.stats.save_histogram(options.out / STATS_PNG,
                                                                    f"run {options.run}: completion tokens")
            if self.report.histogram:
                self.report.files.append(_hashed(options.out / STATS_PNG, records=0))
        except (ExportError, ShardError, OSError) as error:
            self.report.error = str(error)
            write_manifest(self.report)
            raise
        write_manifest(self.report)
        return self.report

    def _export(self, shards: list[Shard], seen: SeenRecords) -> None:
        options = self.options
        outputs = OutputFiles(options.out, max_records=options.max_records_per_file,
                              per_dataset=options.per_dataset, merged=options.merged)
        try:
            # Spill files (shuffle buckets, samples by prompt) sit beside the output, on its disk,
            # and go whatever happens.
            with tempfile.TemporaryDirectory(prefix=".export-", dir=options.out) as scratch:
                workdir = Path(scratch)
                if not options.shuffle:
                    self._read_and_group(shards, seen, workdir, outputs.write)
                    return
                expected = sum(shard.size for shard in shards) * FORMATS[options.format].expansion
                shuffle = BucketShuffle(workdir / "shuffle", expected_bytes=int(expected), seed=options.seed,
                                        max_bucket_bytes=options.shuffle_buffer_bytes)
                tags: dict[str, int] = {}  # the shuffle labels each line with a small int, not a name
                self._read_and_group(shards, seen, workdir,
                                     lambda dataset, data: shuffle.add(tags.setdefault(dataset, len(tags)), data))
                names = {tag: name for name, tag in tags.items()}
                self.progress.phase("writing shuffled", shuffle.lines)
                for tag, data in shuffle.drain():
                    outputs.write(names[tag], data)
                    self.progress.advance(1)
        finally:
            self.report.files += outputs.close()

    def _read_and_group(self, shards: list[Shard], seen: SeenRecords, workdir: Path,
                        emit: Callable[[str, bytes], None]) -> None:
        """The read pass, then the samples it set aside: one line per prompt where the format groups
        them, and their count per prompt for the manifest in every format."""
        self._samples = SampleGroups(workdir / "samples", expected_bytes=sum(shard.size for shard in shards),
                                     max_bucket_bytes=self.options.shuffle_buffer_bytes)
        try:
            self._read(shards, seen, emit)
            if not self._samples.added:
                return
            self.progress.phase("grouping samples", self._samples.added)
            for dataset, prompt_id, samples in self._samples.drain():
                self.report.tally(dataset).samples_per_prompt[len(samples)] += 1
                if self._grouping is not None:
                    emit(dataset, self._encode(dataset, self._grouping.line(prompt_id, samples)))
                self.progress.advance(len(samples))
        finally:
            self._samples.close()

    def _read(self, shards: list[Shard], seen: SeenRecords, emit: Callable[[str, bytes], None]) -> None:
        """Every shard line once: each record kept goes to `emit` as (dataset, output line), or to
        the sample groups."""
        reader = ShardReader(shards, self.options.run)
        self.progress.phase("reading shards", sum(shard.size for shard in shards))
        try:
            for line in reader:
                self.progress.advance(line.size)
                kept = self._take(line, seen)
                if kept is not None:
                    emit(*kept)
        finally:
            self.report.torn = reader.torn
            for torn in reader.torn:
                self.report.tally(torn.path.parent.name).torn_lines += 1

    def _take(self, line: ShardLine, seen: SeenRecords) -> tuple[str, bytes] | None:
        """The record's dataset and output line, or None if it is a duplicate, filtered out or a
        sample set aside to be written with its prompt's others."""
        record, report = line.record, self.report
        dataset, row, record_id = record["dataset"], record.get("row"), record["id"]
        tally = report.tally(dataset)
        # A sample's id and row are its own ("{prompt id}#{k}", its own row slot): samples are
        # distinct records here, only a sample written twice is a duplicate.
        if not seen.first_time(dataset, row, record_id):
            tally.duplicates += 1
            if len(report.duplicate_examples) < DUPLICATE_EXAMPLES:
                report.duplicate_examples.append({"id": record_id, "file": str(line.shard.path), "line": line.line})
            return None
        tally.records += 1
        if tally.index_keyed and (row is None or record_id != f"{dataset}/{row}"):
            tally.index_keyed = False
        tally.count_kind(record)
        report.stats.add(record)
        model = record.get("model") or ""
        if model in report.models or len(report.models) < 100:  # a few names per run; never unbounded
            report.models[model] += 1
        reason = self.options.filters.rejection(record)
        if reason is not None:
            tally.filtered[reason] += 1
            return None
        sample = record.get("sample")
        assert self._samples is not None  # set by _read_and_group
        if sample is not None and self._grouping is not None:
            self._samples.add(dataset, prompt_id_of(record), sample, _formatted(line, self._grouping.part))
            tally.exported += 1
            return None
        formatted = self._encode(dataset, _formatted(line, self.formatter))
        if sample is not None:  # written on its own line; counted per prompt for the manifest
            self._samples.add(dataset, prompt_id_of(record), sample)
        tally.exported += 1
        return dataset, formatted

    def _encode(self, dataset: str, value: dict[str, Any]) -> bytes:
        """An output line, its shape counted in the features the dataset card declares."""
        self.report.features.add(dataset, value)
        return _json_line(value)

    def _write_dead_letters(self) -> None:
        """The prompts that failed for good, as the format's error file (openai-batch's is the one
        OpenAI Batch users expect)."""
        error_line = FORMATS[self.options.format].error_line
        if error_line is None or self.ledger is None:
            return
        errors = OutputFiles(self.options.out, max_records=self.options.max_records_per_file,
                             per_dataset=self.options.per_dataset, merged=self.options.merged, errors=True)
        letters = sorted(self.ledger.dead_letters, key=lambda letter: (letter.payload.dataset, letter.id))
        try:
            for letter in letters:
                dataset = letter.payload.dataset
                error = error_line(letter.id, dataset, letter.error_class, letter.message)
                self.report.error_features.add(dataset, error)
                errors.write(dataset, _json_line(error))
        finally:
            self.report.files += errors.close()

    def _reconcile(self, seen: SeenRecords) -> None:
        assert self.reconciler is not None
        report = self.report
        missing_file: HashedFile | None = None

        def on_missing(row: MissingRow) -> None:
            nonlocal missing_file
            if missing_file is None:
                missing_file = HashedFile(self.options.out / MISSING)
            missing_file.write(_json_line(row.to_dict()))
            report.missing_rows += 1

        self.progress.phase("reconciling with Redis", None)
        records = {name: tally.records for name, tally in report.tallies.items()}
        index_keyed = {name: tally.index_keyed and tally.records > 0 for name, tally in report.tallies.items()}
        try:
            report.reconciliation = self.reconciler.run(seen, records, index_keyed, on_missing)
        finally:
            if missing_file is not None:
                report.files.append(missing_file.close())


def _formatted(line: ShardLine, formatter: Callable[[Record], Any]) -> Any:
    try:
        return formatter(line.record)
    except FormatError as error:
        raise ExportError(f"{line.where}: {error}") from None


def _json_line(value: dict[str, Any]) -> bytes:
    return (json.dumps(value, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def _prepare_out(out: Path) -> None:
    """An export never mixes with an earlier one: the directory must be new or empty."""
    if out.exists() and any(out.iterdir()):
        raise ExportError(f"{out} is not empty: export into a new directory (or remove the old export)")
    out.mkdir(parents=True, exist_ok=True)


def _hashed(path: Path, records: int) -> WrittenFile:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return WrittenFile(path, records, path.stat().st_size, digest.hexdigest())


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
