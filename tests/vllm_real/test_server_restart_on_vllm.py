"""vLLM's server killed mid-run (SIGKILL to its whole tree) and started again on the same port:
the streams it held fail as transient errors and go back to the queue, the worker waits out the
outage (its breaker), and the run completes with every prompt written once, each record still
vLLM's own output token for token (the restarted server loads the same seeded weights)."""
from __future__ import annotations

import pytest
from answers import Oracle
from helpers.data import write_jsonl
from helpers.waits import wait_until
from server import VllmProcess

PROMPTS = 160
MAX_NEW_TOKENS = 200


@pytest.mark.kills_a_server
def test_a_killed_and_restarted_vllm_loses_nothing(venv, model, real_fleet, tmp_path):
    server = VllmProcess(venv, model, name="vllm-restarted").start()
    try:
        real_fleet.configure(reasoning_parser="qwen3", breaker_open_s=2, health_interval_s=1)
        data = write_jsonl(tmp_path / "q.jsonl", [{"prompt": f"restart {i}: count to {i}"} for i in range(PROMPTS)])
        real_fleet.start_worker("short", server.url, concurrency=16)
        real_fleet.genfleet("enqueue", "--run", "restart", "--tokenizer", str(model), "--keep-token-ids",
                            "--temperature", "0", "--max-new-tokens", str(MAX_NEW_TOKENS), f"q={data}")
        wait_until(lambda: len(real_fleet.records("restart")) >= 20, 300, 0.1, "no records before the kill")
        server.kill()
        written_at_kill = len(real_fleet.records("restart"))
        server.spawn(same_port=True).wait_healthy()
        progress = real_fleet.wait_finished("restart", timeout=600)
        assert progress.totals().done == PROMPTS and progress.totals().failed == 0
        assert written_at_kill < PROMPTS  # the kill fell mid-run

        records = real_fleet.records("restart")
        assert sorted(record["id"] for record in records) == sorted(f"q/{i}" for i in range(PROMPTS))
        oracle = Oracle(server, model, "qwen3")
        for record in records:
            answer = oracle.answer(record, MAX_NEW_TOKENS)
            assert record["output_ids"] == answer["token_ids"], record["id"]
            assert (record["reasoning"], record["content"]) == oracle.split(answer["text"]), record["id"]
    finally:
        server.stop()
