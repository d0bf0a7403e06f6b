"""`genfleet status` raises its alarms on a real fleet: empty reasoning, completions cut at a tiny
max_new_tokens, an upstream that is down and a run that makes no progress."""
from __future__ import annotations

import json

import pytest
from helpers.data import write_prompts
from helpers.sim_process import FAST_SIM, SimProcess
from helpers.waits import NOT_YET, wait_until


def test_alarms_fire_on_empty_reasoning_and_on_tiny_max_tokens(fleet, tmp_path):
    data = write_prompts(tmp_path / "q.jsonl", 10, "think question number")
    with SimProcess(*FAST_SIM, "--reasoning-share", "0") as sim:
        fleet.start_worker("short", sim.url, concurrency=8)
        fleet.enqueue("noreason", f"q={data}")
        fleet.enqueue("tiny", f"q={data}", extra=("--max-new-tokens-short", "3"))
        fleet.wait_finished("noreason", timeout=60)
        fleet.wait_finished("tiny", timeout=60)
    empty = json.loads(fleet.genfleet("status", "--run", "noreason", "--json").stdout)["alarms"]
    assert any("100% of completions have empty reasoning" in line for line in empty)
    assert not any("max_new_tokens" in line for line in empty)
    tiny = json.loads(fleet.genfleet("status", "--run", "tiny", "--json").stdout)
    assert any("100% of completions stopped at max_new_tokens" in line for line in tiny["alarms"])
    assert tiny["datasets"][0]["truncated_pct"] == 100.0
    assert tiny["datasets"][0]["completion_tokens_stats"]["p99"] == pytest.approx(3, rel=0.1)
    table = fleet.genfleet("status", "--run", "tiny").stdout
    assert "ALARM" in table and "stopped at max_new_tokens" in table


def test_a_dead_upstream_and_a_stalled_run_raise_alarms(fleet, tmp_path):
    data = write_prompts(tmp_path / "q.jsonl", 5, "stuck question number")
    fleet.configure(health_interval_s=0.5, retry_backoff_s=0.2, retry_backoff_max_s=0.5)
    sim = SimProcess(*FAST_SIM)
    with sim:
        worker = fleet.start_worker("short", sim.url, concurrency=4)
        sim.kill()
        fleet.enqueue("stuck", f"q={data}")

        def alarms() -> list[str]:
            status = json.loads(fleet.genfleet("status", "--run", "stuck", "--json",
                                               "--no-progress-minutes", "0.02").stdout)
            lines = status["alarms"]
            return lines if any("is down" in a for a in lines) and any("no progress" in a for a in lines) else []

        lines = wait_until(alarms, 30, 1, "no upstream-down and no-progress alarms", ignore=NOT_YET)
        worker.kill()  # its tasks wait for a healthy upstream; a graceful stop would wait too
    assert any(f"upstream {sim.url} is down (circuit open in 1 of 1 workers" in line for line in lines)
    assert any("no prompt has finished since enqueue" in line for line in lines)

