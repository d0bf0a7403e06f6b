"""A run's state rebuilt from its shards (common/rebuild.py) against a real Redis that lost it: the
done bits, counters and `total` a finished run leaves come back from the records alone, once however
often and from however many copies they are read, and a re-run enqueue then has nothing to publish."""
from __future__ import annotations

import shutil

from helpers.export_runs import synthetic_run

from genfleet.common.fleet_stats import read_lengths
from genfleet.common.rebuild import recover
from genfleet.common.run_state import Outcome, RunState

# synthetic_run settles rows with no empty-content count; a worker (and recover) counts record 0's.
COUNTERS = ("done", "total", "prompt_tokens", "completion_tokens", "reasoning_tokens", "truncated")


def state_of(state: RunState) -> tuple[dict[str, int], set[int], set[int]]:
    counters = state.counters("syn")
    return {name: counters.get(name, 0) for name in COUNTERS}, state.done_row_set("syn"), state.enqueued_row_set("syn")


def test_a_wiped_run_is_rebuilt_from_its_records_as_its_workers_and_producer_left_it(redis_client, tmp_path):
    synthetic_run(tmp_path / "out", redis_client, "r", 40)
    state = RunState(redis_client, "r")
    before = state_of(state)
    redis_client.flushdb()  # Redis lost its data
    assert state_of(state) == ({name: 0 for name in COUNTERS}, set(), set())

    found = recover(state, [tmp_path / "out"], reasoning_parser="none")
    assert state_of(state) == before
    assert (sum(found.records.values()), found.settled["syn"], found.published["syn"]) == (40, 40, 40)
    assert read_lengths(redis_client, "r", ["syn"])["syn"].samples == 40  # the lengths `auto` and status read


def test_recovering_again_or_from_a_second_copy_counts_nothing_twice(redis_client, tmp_path):
    synthetic_run(tmp_path / "out", redis_client, "r", 30)
    state = RunState(redis_client, "r")
    before = state_of(state)
    redis_client.flushdb()
    recover(state, [tmp_path / "out"], reasoning_parser="none")
    shutil.copytree(tmp_path / "out", tmp_path / "copy")  # another host's directory with the same records
    again = recover(state, [tmp_path / "out", tmp_path / "copy"], reasoning_parser="none")
    assert (sum(again.records.values()), again.settled["syn"], again.published["syn"]) == (60, 0, 0)
    assert state_of(state) == before


def test_rows_a_worker_settled_after_the_loss_are_counted_as_published_once(redis_client, tmp_path):
    """A prompt in flight at the loss finishes and its worker settles it in the empty Redis (done bit,
    no enqueued bit, no `total`): recover marks it published, so `total` again covers every row."""
    records = synthetic_run(tmp_path / "out", redis_client, "r", 10)
    state = RunState(redis_client, "r")
    before = state_of(state)
    redis_client.flushdb()
    state.mark_done("syn", 3, Outcome.of_record(records[3], expects_reasoning=False))
    found = recover(state, [tmp_path / "out"], reasoning_parser="none")
    assert (found.settled["syn"], found.published["syn"]) == (9, 10)
    assert state_of(state) == before


def test_a_record_without_a_row_is_reported_not_guessed(redis_client, tmp_path):
    records = synthetic_run(tmp_path / "out", redis_client, "r", 4)
    redis_client.flushdb()
    shard = tmp_path / "out" / "r" / "syn" / "old-00000.jsonl"
    legacy = records[0].to_json_line().replace(b',"row":0', b"")
    assert legacy != records[0].to_json_line()
    shard.write_bytes(legacy)
    found = recover(RunState(redis_client, "r"), [tmp_path / "out"], reasoning_parser="none")
    assert (found.records["syn"], found.without_row["syn"], found.settled["syn"]) == (5, 1, 4)
