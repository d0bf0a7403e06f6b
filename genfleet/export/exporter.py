"""`genfleet export`: a run's shards, from one or several output roots, become one clean dataset.

One streaming pass: read each shard line → keep the first record of each prompt → count it in the
stats → filter → format → write (or, with `--shuffle`, spill to random buckets and write after).
Samples (`--samples N`) of the formats that write a line per prompt are spilled to disk by prompt
instead and written, one line per prompt, after the pass (`samples`). Memory holds one record at a
time plus a bit per prompt (dedupe), a count per distinct completion length (stats) and, when
shuffling or grouping samples, one bucket; it does not grow with the number of records.
Then the dead letters (openai-batch's error file), reconciliation against Redis, the stats and
`manifest.json`, which says whether the export is complete and hashes every file written.
"""
from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from genfleet.common.shards import Shard, ShardError, ShardLine, ShardReader, find_shards
from genfleet.export.conversation import FormatError, Record
from genfleet.export.dedupe import SeenRecords
from genfleet.export.formats import FORMATS, RecordFormatter
from genfleet.export.reconcile import MissingRow, Reconciler, RunLedger
from genfleet.export.report import ExportOptions, ExportReport
from genfleet.export.samples import SampleGroups, prompt_id_of
from genfleet.export.sinks import BucketShuffle, HashedFile, OutputFiles, WrittenFile

MANIFEST = "manifest.json"
MISSING = "missing.jsonl"
STATS_PNG = "stats.png"
DUPLICATE_EXAMPLES = 20


class ExportError(Exception):
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

