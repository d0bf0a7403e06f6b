"""End to end, a stream corrupted on purpose is counted, retried by Celery and never written: every
record equals what the simulated server says it generated (its own completion log). Every length in
both stream modes is checked on the task body in process (tests/unit/test_task_fidelity.py)."""
from __future__ import annotations

import json

import pytest
from helpers.data import read_jsonl, write_jsonl
from helpers.fidelity import check_against_log
from helpers.paths import TOKENIZER
from helpers.sim_process import SimProcess


def write_dataset(path, numbers) -> None:
    write_jsonl(path, [{"id": f"q{n}", "prompt": f"question {n}"} for n in numbers])


@pytest.mark.parametrize("corruption", [
    ("--miscount-rate", "0.5"),
    ("--incremental", "--drop-chunk-rate", "0.5"),
], ids=["final-count-off", "chunk-dropped"])
def test_a_corrupted_stream_is_counted_retried_and_never_written(corruption, fleet, tmp_path):
    log_path = tmp_path / "completions.jsonl"
    write_dataset(tmp_path / "c.jsonl", range(30))
    fleet.configure(tokenizer=TOKENIZER, max_attempts=30, retry_backoff_s=0.05, retry_backoff_max_s=0.2,
                    breaker_failures=1000)
    with SimProcess("--length-tokens", "100:160", "--rate", "5000", "--fault-seed", "7", *corruption,
                    "--log-completions", str(log_path)) as sim:
        fleet.start_worker("short", sim.url)
        fleet.enqueue("c", f"c={tmp_path / 'c.jsonl'}", extra=("--keep-token-ids",))
        progress = fleet.wait_finished("c", timeout=180)
        status = json.loads(fleet.genfleet("status", "--run", "c", "--json").stdout)

    log = read_jsonl(log_path)
    corrupted = sum(1 for line in log if line["faults"])
    totals = progress.totals()
    assert totals.integrity > 0 and (totals.done, totals.failed) == (30, 0)
    # Each corrupted response was one failed attempt, retried until a clean one came. The sim logs a
    # response only if the client read it to the end: a dropped chunk is caught at the next one,
    # and the client hangs up, so only a miscount (caught at the last chunk) is in the log each time.
    if "--miscount-rate" in corruption:
        assert totals.integrity == corrupted
    assert any("integrity check" in alarm for alarm in status["alarms"])
    records = fleet.records("c")
    assert len(records) == 30
    check_against_log(records, log)


def test_a_stream_that_is_always_corrupt_is_dead_lettered_as_integrity(fleet, tmp_path):
    write_dataset(tmp_path / "d.jsonl", range(3))
    fleet.configure(max_attempts=2, retry_backoff_s=0.05, retry_backoff_max_s=0.1, breaker_failures=1000)
    with SimProcess("--length-tokens", "40:60", "--rate", "5000", "--miscount-rate", "1") as sim:
        fleet.start_worker("short", sim.url)
        fleet.enqueue("d", f"d={tmp_path / 'd.jsonl'}")
        progress = fleet.wait_finished("d", timeout=120)
        failures = fleet.genfleet("failures", "--run", "d").stdout

    totals = progress.totals()
    assert (totals.done, totals.failed, totals.integrity) == (0, 3, 6)
    assert fleet.records("d") == []
    assert "integrity" in failures and "completion_tokens" in failures
