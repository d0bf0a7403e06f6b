"""The workers' check for prompts nobody holds: enqueued, yet neither queued, in transit, running (in
kombu's `unacked`), done, skipped nor dead-lettered. Run by the lease reaper under its fleet-wide
lock, at most once per `unaccounted_check_interval_s` across the fleet.

Transit lists (`workers/broker.py`) close the window kombu's BRPOP left open, so such a prompt
means a loss no worker can repair (its message is gone: a Redis without AOF restarted, a key
deleted by hand, a message dropped by an older genfleet). What the check can do is say so: a row
found unaccounted for in two checks in a row (a message moves between queue, transit list and
`unacked` while a check reads them) is recorded in the run's state, `genfleet status` shows it
with the fix, `genfleet enqueue --recover-lost`.

Cost: each check reads every run's counters and the lengths of the queues, transit lists and
`unacked` (a few commands, under a millisecond). Only when those disagree (fewer messages than
prompts pending, other than the rows already recorded), or while rows wait for their second
sighting, does it read every message (O(queued + in flight), bounded with `--max-queue-depth`:
about 0.5 s per 10,000 queued prompts) and the bitmaps of the runs with prompts pending.
"""
from __future__ import annotations

import logging
from collections import defaultdict

import redis

from genfleet.common import kombu_wire
from genfleet.common.keys import KOMBU_UNACKED, PREFIX, TRANSITS, UNACCOUNTED_CHECK, RunKeys, queue_list
from genfleet.common.queues import PARTITIONS
from genfleet.common.run_state import RunState

log = logging.getLogger(__name__)

SCAN_CHUNK = 1000
Rows = dict[str, dict[str, set[int]]]  # run -> dataset -> rows


def check_if_due(client: redis.Redis, interval_s: float) -> dict[str, dict[str, int]] | None:
    """Runs `check` unless a worker did in the last `interval_s`; None if it did not run."""
    if not client.set(UNACCOUNTED_CHECK, "1", nx=True, ex=max(int(interval_s), 1)):
        return None
    return check(client)


def check(client: redis.Redis) -> dict[str, dict[str, int]]:
    """Records, per run and dataset, how many rows two checks in a row found unaccounted for;
    returns the runs that have any."""
    states = {run: RunState(client, run) for run in _runs(client)}
    pending = {run: total for run, state in states.items() if (total := _pending(state))}
    recorded = [run for run in states if client.exists(RunKeys(run).unaccounted)]
    for run in set(recorded) - set(pending):  # finished since: nothing can be missing
        states[run].record_unaccounted({})
    deficit = sum(pending.values()) - _messages(client)
    known = {run: states[run].unaccounted() for run in recorded if run in pending}
    if deficit <= 0 and not known:  # a message for every prompt pending, nothing recorded
        return {}
    if deficit > 0 and deficit == sum(sum(counts.values()) for counts in known.values()):
        return {run: counts for run, counts in known.items() if counts}  # the losses already recorded
    found = _unaccounted_rows(client, list(pending))
    report = {}
    for run in pending:
        confirmed = states[run].record_unaccounted(found.get(run, {}))
        if confirmed:
            report[run] = {dataset: len(rows) for dataset, rows in confirmed.items()}
            log.warning("run %s: %s prompt(s) neither queued, running, done nor dead: their messages are "
                        "lost; `genfleet enqueue --run %s --recover-lost DATASETS` publishes them again",
                        run, sum(report[run].values()), run)
    return report


def _runs(client: redis.Redis) -> list[str]:
    suffix = ":datasets"
    runs = []
    for raw in client.scan_iter(match=f"{PREFIX}:*{suffix}", count=SCAN_CHUNK):
        key = raw.decode() if isinstance(raw, bytes) else raw
        runs.append(key[len(PREFIX) + 1:-len(suffix)])
    return runs


def _pending(state: RunState) -> int:
    total = 0
    for dataset in state.datasets():
        c = state.counters(dataset)
        total += max(c["total"] - c["done"] - c["failed"] - c["skipped"], 0)
    return total


def _messages(client: redis.Redis) -> int:
    """Messages in queues, transit lists and `unacked`: one each per prompt pending, when none is lost."""
    transits = client.zrange(TRANSITS, 0, -1)
    pipe = client.pipeline(transaction=False)
    for key in [queue_list(queue) for queue in PARTITIONS] + list(transits):
        pipe.llen(key)
    pipe.hlen(KOMBU_UNACKED)
    return sum(pipe.execute())


def _unaccounted_rows(client: redis.Redis, runs: list[str]) -> Rows:
    """Rows enqueued (before the messages are read), then not present in any message, then not done
    nor dead (read after)."""
    states = {run: RunState(client, run) for run in runs}
    enqueued = {run: {ds: state.enqueued_row_set(ds) for ds in state.datasets()} for run, state in states.items()}
    present: Rows = defaultdict(lambda: defaultdict(set))
    for envelope in kombu_wire.held_messages(client, SCAN_CHUNK):
        payload = kombu_wire.task_payload(envelope)
        if payload and payload.get("run") in states:
            present[payload["run"]][payload["dataset"]].add(payload["row"])
    found: Rows = {}
    for run, state in states.items():
        dead: dict[str, set[int]] = defaultdict(set)
        for letter in state.read_dead_letters():
            dead[letter.payload.dataset].add(letter.payload.row)
        for dataset, rows in enqueued[run].items():
            missing = rows - present[run][dataset] - state.done_row_set(dataset) - dead[dataset]
            if missing:
                found.setdefault(run, {})[dataset] = missing
    return found
