"""A server whose own running cap holds the batch down is named, with its flag, by `status` (an
alarm) and `doctor`: SGLang 0.5.23 started with a deliberately low `--max-running-requests`, a
worker offering it far more, requests waiting and the KV cache mostly free (common/server_limits.py;
0.5.23 reports its cap in `/v1/loads`, `managers/load_snapshot.py`)."""
from __future__ import annotations

import pytest
from helpers.server_limits import assert_the_cap_is_named
from helpers.waits import wait_until
from server import RealServer
from tier import enqueue, write_plan_prompts

LOW_CAP = 4
PROMPTS = 600
PLAN = "[plan len=300]"
QUICK = dict(admission_interval_s=0.5, health_interval_s=1, shutdown_grace_s=1)


@pytest.mark.timeout(600)
def test_status_and_doctor_name_max_running_requests_within_a_minute(venv, model, real_fleet, tmp_path):
    server = RealServer(venv, model, "--max-running-requests", str(LOW_CAP), name="low-cap").start()
    try:
        real_fleet.configure(**QUICK)
        data = write_plan_prompts(tmp_path / "c.jsonl", PROMPTS, (PLAN,), stem="cap")
        real_fleet.start_worker("short", server.url, concurrency=32)
        enqueue(real_fleet, model, "cap", f"c={data}", extra=("--max-new-tokens", "400"))
        wait_until(lambda: server.load()["num_waiting_reqs"] > 0, 120, 0.2, "requests waiting at the server")

        assert_the_cap_is_named(real_fleet, "cap", server.url, "--max-running-requests", LOW_CAP)
    finally:
        server.stop()
