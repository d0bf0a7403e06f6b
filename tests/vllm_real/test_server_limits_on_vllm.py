"""A vLLM server whose own running cap holds the batch down is named, with its flag, by `status`
(an alarm) and `doctor`: vLLM 0.32.0 started with a deliberately low `--max-num-seqs`, a worker
offering it far more, requests waiting and the KV cache mostly free. vLLM's `/metrics` does not
carry max_num_seqs, so the cap is the running count held over several pages with requests waiting
(common/server_limits.py, workers/servers/vllm.py `LoadMeter`).

On the bench's model, not the tier's tiny one: the tiny model ends a batch of 4 in ~60 ms, before
the next requests reach the server, so every other page read 0 running and 0 waiting and no count
was ever held (measured here); the bench's 6 layers take seconds over a completion of ~250 tokens."""
from __future__ import annotations

import httpx
import pytest
from helpers.data import write_jsonl
from helpers.server_limits import assert_the_cap_is_named
from helpers.waits import wait_until
from server import VllmProcess

LOW_CAP = 4
PROMPTS = 3000  # far more than the cap runs in the test's minutes: the server never runs dry, doctor included
MAX_NEW_TOKENS = 400
QUICK = dict(admission_interval_s=0.5, health_interval_s=1, shutdown_grace_s=1)


def waiting(server: VllmProcess) -> float:
    """`vllm:num_requests_waiting`, from its /metrics."""
    page = httpx.get(f"{server.url}/metrics", timeout=10).raise_for_status().text
    return sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines()
               if line.startswith("vllm:num_requests_waiting{"))


@pytest.mark.timeout(600)
def test_status_and_doctor_name_max_num_seqs_within_a_minute(venv, bench_model, fleet, tmp_path):
    server = VllmProcess(venv, bench_model, "--max-num-seqs", str(LOW_CAP), name="vllm-low-cap").start()
    try:
        fleet.configure(tokenizer=bench_model, **QUICK)
        data = write_jsonl(tmp_path / "c.jsonl", [{"prompt": f"cap {i}: count to {i}"} for i in range(PROMPTS)])
        fleet.start_worker("short", server.url, concurrency=32)
        fleet.genfleet("enqueue", "--run", "cap", "--tokenizer", str(bench_model), "--temperature", "0",
                       "--max-new-tokens", str(MAX_NEW_TOKENS), f"c={data}")
        wait_until(lambda: waiting(server) > 0, 120, 0.2, "requests waiting at the server")

        # vLLM's cap is known after a few pages with requests waiting (workers/servers/vllm.py).
        assert_the_cap_is_named(fleet, "cap", server.url, "--max-num-seqs", LOW_CAP)
    finally:
        server.stop()
