"""A rolling upgrade: a task with a field this worker does not know (a newer genfleet's, as a
staged part's follow-up carries `staged_from` to workers from before staged caps) is neither run
without it nor failed: it goes back to the queue for an upgraded worker, said in the log, with no
attempt counted, no dead letter and no record."""
from __future__ import annotations

from helpers.data import write_prompts
from helpers.kombu_messages import encoder
from helpers.producer_cli import queued_payloads
from helpers.sim_process import ONE_SECOND, SimProcess
from helpers.waits import wait_until

from genfleet.common.queues import SHORT
from genfleet.common.run_state import RunState


def test_a_task_from_a_newer_genfleet_goes_back_to_the_queue(fleet, tmp_path):
    fleet.enqueue("up", f"d={write_prompts(tmp_path / 'd.jsonl', 1)}")
    real = queued_payloads(fleet.redis, SHORT)[0]
    fleet.redis.delete(SHORT)
    _, message = encoder().encode({**real, "from_the_future": 1}, SHORT, real["id"])
    fleet.redis.lpush(SHORT, message)
    with SimProcess(*ONE_SECOND) as sim:
        worker = fleet.start_worker(SHORT, sim.url, concurrency=2)
        said = "fields this worker does not know (from_the_future)"
        # Said twice: given back, and taken again (the only task on the queue).
        wait_until(lambda: worker.log.read_text().count(said) >= 2, 60, 0.2, "the task was not given back")
        worker.stop()
        assert sim.stats()["requests_started"] == 0
    wait_until(lambda: fleet.redis.llen(SHORT) == 1, 30, 0.2, "the task is not on its queue")
    state = RunState(fleet.redis, "up")
    assert not state.dead_letters() and not fleet.records("up")
    assert queued_payloads(fleet.redis, SHORT)[0]["from_the_future"] == 1  # as it came, for a newer worker
