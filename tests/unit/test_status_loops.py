"""Loops and truncation handling as the operator sees them: `genfleet status`'s `loop %` column, its
JSON shares and counters and its loop alarm (on snapshots built by hand), the counters read back
from a real Redis, and the worker's Prometheus counters fed by `telemetry.completed`."""
from __future__ import annotations

from dataclasses import replace

import pytest
import redis

from genfleet.common.records import CompletionRecord, TaskPayload, Timing, Usage
from genfleet.common.run_state import Outcome, RunState
from genfleet.status.alarms import DEFAULT_ALARMS, LOOP_ALARM, AlarmSettings, alarms
from genfleet.status.read_model import (
    DatasetProgress,
    DatasetStatus,
    LengthStats,
    RunProgress,
    RunStatus,
    Throughput,
    read_progress,
)
from genfleet.status.render import dataset_json, dataset_table, status_json
from genfleet.workers import telemetry
from genfleet.workers.telemetry import METRICS

IDLE = {window: Throughput(0.0, 0.0, 0.0, 0.0, 0.0, None) for window in ("1m", "10m")}


def progress(dataset: str, done: int, looped: int, **counters: int) -> DatasetProgress:
    fields = dict(total=done, done=done, failed=0, rejected=0, skipped=0, prompt_tokens=10 * done,
                  completion_tokens=100 * done, reasoning_tokens=0, truncated=0, empty_reasoning=0,
                  empty_content=0, aborted=0, integrity=0, looped=looped, looped_tokens=1000 * looped)
    return DatasetProgress(dataset=dataset, **{**fields, **counters})


def snapshot(*datasets: DatasetProgress) -> RunStatus:
    run = RunProgress("r", list(datasets), {"short": 0, "long": 0}, 0)
    rows = [DatasetStatus(d, {"short": d.done}, 0, IDLE, LengthStats(0, None, None, None), None) for d in datasets]
    totals = DatasetStatus(run.totals(), {}, 0, IDLE, LengthStats(0, None, None, None), None)
    return RunStatus(run="r", time=1000.0, progress=run, datasets=rows, partitions=[], upstreams=[], workers=1,
                     created_at=900.0, first_finished=950.0, last_finished=999.0, totals=totals)


def table_columns(status: RunStatus) -> dict[str, list[str]]:
    table = dataset_table(status)
    return {str(column.header): [str(cell) for cell in column.cells] for column in table.columns}


def test_the_table_shows_the_looped_share_next_to_the_truncated_one():
    status = snapshot(progress("math", 200, 7, truncated=20), progress("chat", 50, 0))
    columns = table_columns(status)
    headers = list(columns)
    assert headers.index("loop %") == headers.index("trunc %") + 1
    assert columns["loop %"] == ["3.5", "0.0", "2.8"]  # math, chat, all (7 of 250)
    assert columns["trunc %"] == ["10.0", "0.0", "8.0"]


def test_json_has_the_looped_share_and_the_raw_counters():
    row = dataset_json(snapshot(progress("math", 200, 7, continued=5, regenerated=2)).datasets[0])
    assert row["looped_pct"] == 3.5 and row["truncated_pct"] == 0.0
    assert {key: row[key] for key in ("looped", "looped_tokens", "continued", "regenerated")} == {
        "looped": 7, "looped_tokens": 7000, "continued": 5, "regenerated": 2}
    assert dataset_json(snapshot(progress("new", 0, 0)).datasets[0])["looped_pct"] is None
    totals = status_json(snapshot(progress("a", 100, 1), progress("b", 100, 3)))["totals"]
    assert totals["looped"] == 4 and totals["looped_pct"] == 2.0


def loop_alarms(status: RunStatus, settings: AlarmSettings = DEFAULT_ALARMS) -> list[str]:
    return [line for line in alarms(status, settings) if "looped" in line]


def test_the_loop_alarm_fires_above_its_threshold_and_names_the_tokens_lost():
    assert LOOP_ALARM == 0.02
    (line,) = loop_alarms(snapshot(progress("math", 100, 3), progress("chat", 100, 2)))
    assert line.startswith("math: 3.0% of completions looped") and "3,000 completion tokens" in line
    assert not loop_alarms(snapshot(progress("math", 100, 2)))  # at the threshold, not above
    assert not loop_alarms(snapshot(progress("tiny", 4, 4)))  # too few completions to judge
    assert not loop_alarms(snapshot(progress("math", 100, 3)), AlarmSettings(loop=0.05))
    assert loop_alarms(snapshot(progress("math", 100, 1)), AlarmSettings(loop=0.005))


def test_status_reads_the_loop_and_truncation_counters_from_redis(redis_client):
    state = RunState(redis_client, "r")
    state.register_dataset("d", "d.jsonl")
    state.count("d", "total", 3)
    state.mark_done("d", 0, Outcome(5, 300, 0, False, False, False, looped=True))
    state.mark_done("d", 1, Outcome(5, 40, 0, False, False, False, continued=True, regenerated=True))
    state.mark_done("d", 2, Outcome(5, 20, 0, False, False, False))
    (d,) = read_progress(redis_client, "r").datasets
    assert (d.done, d.looped, d.looped_tokens, d.continued, d.regenerated) == (3, 1, 300, 1, 1)


# --- Prometheus ----------------------------------------------------------------------------------
class _NoRedisRuntime:
    """Telemetry's Redis writes fail (and are only logged): these tests read the Prometheus side."""

    def run_state(self, run: str) -> RunState:
        raise redis.ConnectionError("no Redis in this test")


def completed(dataset: str, **fields: object) -> None:
    payload = TaskPayload(run="metrics-run", id=f"{dataset}/0", dataset=dataset, row=0, partition="short",
                          prompt_tokens=5, max_new_tokens=100, messages=[])
    record = CompletionRecord(
        id=payload.id, run=payload.run, dataset=dataset, partition="short", messages=[], reasoning="",
        content="x", finish_reason="stop", matched_stop=None, usage=Usage(5, 80, 0, 0), upstream="http://u",
        model="m", sampling={}, timing=Timing(0.0, 0.0, 0.1, 1.0), attempts=1, worker="w", row=0)
    telemetry.completed(_NoRedisRuntime(), payload, replace(record, **fields))  # type: ignore[arg-type]


def metric(name: str, dataset: str) -> float | None:
    return METRICS.registry.get_sample_value(name, {"run": "metrics-run", "dataset": dataset, "partition": "short",
                                                    "upstream": "http://u"})


@pytest.mark.parametrize("loop_field", [True, False], ids=["loop-field", "finish-reason-only"])
def test_a_looped_record_counts_a_loop_and_its_completion_tokens(loop_field):
    dataset = f"looped-{loop_field}"
    looped = {"finish_reason": "loop", "loop": {"period": 4, "repeats": 30, "start": 10, "at_token": 130}
              if loop_field else None}
    completed(dataset, **looped)
    completed(dataset, **looped)
    assert metric("genfleet_loops_total", dataset) == 2
    assert metric("genfleet_loop_tokens_total", dataset) == 160
    assert metric("genfleet_continuations_total", dataset) == 0


def test_continued_records_count_and_plain_ones_start_every_series_at_zero():
    completed("plain")
    # The series exist from the first completion, so rate() sees the first loop when it comes.
    assert metric("genfleet_loops_total", "plain") == 0
    assert metric("genfleet_loop_tokens_total", "plain") == 0
    assert metric("genfleet_continuations_total", "plain") == 0
    completed("cont", continued=2)
    completed("cont", continued=0)
    assert metric("genfleet_continuations_total", "cont") == 1
    assert metric("genfleet_loops_total", "cont") == 0
