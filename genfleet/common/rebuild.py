"""A run's state in Redis rebuilt from its shards, the truth of what is done (`genfleet recover`,
and `genfleet enqueue` for a run Redis does not have: producer/command.py).

Every record a worker wrote was fsynced before its task was acknowledged, and carries its run,
dataset and row. So when Redis loses a run's state (a restart without AOF, a failover that dropped
the last writes, a `FLUSHALL`, a pod rescheduled without its volume), the records say which rows
are done: `recover` settles each of them as the worker that wrote it did (its done bit, counters,
length histogram and rate bucket at the minute it finished: `RunState.mark_recovered`, the same
script as `RunState.mark_done`), and marks it published and counts it in `total` as the producer
would have. Re-running `genfleet enqueue` with the same datasets then publishes only the rows with
no record, and `status`, export and the card agree with the disk again.

Safe to run again, and from several hosts against one Redis (each with its own output directory, or
one with every host's directories as `--from`): a row is settled and counted once however many
records of it are read, whoever reads them. Run it before the fleet takes the run's prompts again;
a worker that finishes a prompt meanwhile settles it itself, and recover then finds it settled.

What it cannot rebuild: the dead letters (their prompts have no record and are published again by
the enqueue, getting their attempts anew), the rejections (the enqueue finds them again), and the
`empty_reasoning` counter of datasets whose chat template kwargs decide whether a reply opens in
reasoning (it judges by the worker's parser alone, `GENFLEET_REASONING_PARSER`).
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from genfleet.common import fleet_stats
from genfleet.common.reasoning import get_format, starts_in_reasoning
from genfleet.common.records import CompletionRecord
from genfleet.common.run_state import Outcome, RunState
from genfleet.common.shards import ShardReader, find_shards

BATCH = 1000  # records settled per round trip


@dataclass
class Recovered:
    """Per dataset: records read, rows settled now (their state was lost), rows newly counted as
    published, records without a row (written before records carried one), torn lines skipped."""
    records: Counter[str] = field(default_factory=Counter)
    settled: Counter[str] = field(default_factory=Counter)
    published: Counter[str] = field(default_factory=Counter)
    without_row: Counter[str] = field(default_factory=Counter)
    torn: int = 0


def recover(state: RunState, roots: list[Path], *, reasoning_parser: str) -> Recovered:
    """Settle in `state` every row that has a record under `roots`."""
    expects_reasoning = starts_in_reasoning(get_format(reasoning_parser), {})
    reader = ShardReader(find_shards(roots, state.run), state.run)
    found = Recovered()
    batches: dict[str, list] = defaultdict(list)
    for line in reader:
        record = CompletionRecord.from_dict(line.record)
        dataset = record.dataset
        found.records[dataset] += 1
        if record.row is None:
            found.without_row[dataset] += 1
            continue
        finished_at = record.timing.started_at + record.timing.duration_s
        updates = fleet_stats.completion_updates(state.run, dataset, record.partition, record.usage.completion_tokens,
                                                 record.timing.duration_s, now=finished_at)
        batches[dataset].append((record.row, Outcome.of_record(record, expects_reasoning=expects_reasoning), updates))
        if len(batches[dataset]) >= BATCH:
            _settle(state, dataset, batches.pop(dataset), found)
    for dataset, rows in batches.items():
        _settle(state, dataset, rows, found)
    found.torn = len(reader.torn)
    return found


def _settle(state: RunState, dataset: str, rows: list, found: Recovered) -> None:
    settled, published = state.mark_recovered(dataset, rows)
    found.settled[dataset] += settled
    found.published[dataset] += published
