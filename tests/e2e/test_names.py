"""Names are checked at both ends: a task forged onto the queue with a run or dataset name that
leads out of the output root (`../../trav`, `..`, `.`) is dead-lettered as permanent before any
generation, and no file appears outside the root; `genfleet enqueue` refuses such names up front."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers.data import write_prompts
from helpers.kombu_messages import encoder
from helpers.producer_cli import enqueue, queued_payloads
from helpers.sim_process import ONE_SECOND, SimProcess
from helpers.waits import wait_until

from genfleet.common.queues import SHORT
from genfleet.common.run_state import PERMANENT, RunState

# (run, dataset, id) of each forged task; the first three are the issue's.
FORGED = [
    ("../../trav", "B1_glaive", "B1_glaive/0"),
    ("ok", "..", "../0"),
    ("ok", ".", "./0"),
    ("/tmp", "d", "d/0"),
    ("ok", "d/../../../x", "d/../../../x/0"),
    ("forged", "d", "elsewhere/0"),  # an id that does not belong to its dataset
]


def files_under(root: Path) -> set[Path]:
    """Every file under `root` but the processes' logs."""
    return {Path(folder) / name for folder, _, names in os.walk(root) for name in names if not name.endswith(".log")}


def test_a_forged_task_with_a_traversing_name_writes_nothing_and_is_dead_lettered_permanent(fleet, tmp_path):
    fleet.configure(max_attempts=1)
    fleet.enqueue("ok", f"d={write_prompts(tmp_path / 'd.jsonl', 1)}")
    real = queued_payloads(fleet.redis, SHORT)[0]
    codec = encoder()
    for run, dataset, prompt_id in FORGED:
        _, message = codec.encode({**real, "run": run, "dataset": dataset, "id": prompt_id}, SHORT, prompt_id)
        fleet.redis.lpush(SHORT, message)
    outside_before = files_under(tmp_path.parent) - files_under(fleet.output_dir)

    with SimProcess(*ONE_SECOND) as sim:
        fleet.start_worker(SHORT, sim.url, concurrency=4)

        def every_forged_task_dead() -> bool:
            return all(prompt_id in RunState(fleet.redis, run).dead_letters() for run, _, prompt_id in FORGED)

        wait_until(every_forged_task_dead, 60, 0.2, "not every forged task was dead-lettered")
        fleet.wait_finished("ok", timeout=60)
        assert sim.stats()["requests_started"] == 1, "a forged task reached the server (GPU time)"

    for run, _, prompt_id in FORGED:
        letter = RunState(fleet.redis, run).dead_letters()[prompt_id]
        assert letter["error_class"] == PERMANENT and "unsafe task" in letter["message"], letter
        assert letter["attempts"] == 1
    # The real prompt of the same queue was written, where it belongs, and nothing else was.
    assert {r["id"] for r in fleet.records("ok")} == {"d/0"}
    written = files_under(fleet.output_dir)
    assert written and all(path.parent == fleet.output_dir / "ok" / "d" for path in written), written
    assert files_under(tmp_path.parent) - files_under(fleet.output_dir) == outside_before
    assert not (tmp_path.parent.parent / "trav").exists()
    records = fleet.records("ok")
    print(f"forged names: {{'in': {len(FORGED) + 1}, 'done': {len({r['id'] for r in records})}, "
          f"'dead': {len(FORGED)}, 'duplicated': {len(records) - len({r['id'] for r in records})}, "
          f"'files outside the root': 0, 'requests reaching the server': 1}}")


@pytest.mark.parametrize("argument", [
    ("--run", "../../trav"), ("--run", ".hidden"), ("--run", "a" * 129), ("--run", "run with spaces"),
    ("..=DATA",), (".=DATA",), ("b/c=DATA",), ("x:y=DATA",), ("ünï=DATA",)])
def test_enqueue_refuses_a_bad_run_or_dataset_name(argument, redis_url, redis_client, tmp_path):
    data = write_prompts(tmp_path / "p.jsonl", 3)
    args = [arg.replace("DATA", str(data)) for arg in argument]
    if args[0] != "--run":
        args = ["--run", "good", *args]
    else:
        args = [*args, f"ok={data}"]
    result = enqueue(redis_url, *args, run="", expect_exit=2)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "name" in lines[0], lines
    assert ("--run" in lines[0]) == (argument[0] == "--run")
    assert redis_client.dbsize() == 0, "something was written to Redis"


def test_a_run_file_with_a_bad_dataset_name_is_refused(redis_url, redis_client, tmp_path):
    data = write_prompts(tmp_path / "p.jsonl", 3)
    run_file = tmp_path / "run.toml"
    run_file.write_text(f'run = "r"\n[datasets.".."]\npath = "{data}"\n')
    result = enqueue(redis_url, "--run-file", str(run_file), run="", expect_exit=2)
    assert "dataset '..'" in result.stderr and redis_client.dbsize() == 0
