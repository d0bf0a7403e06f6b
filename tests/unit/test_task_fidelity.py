"""The real task body in process (`helpers/task_harness.py`) against a simulated server over real
HTTP: every completion length from 1 to 200 is written exactly as the server generated it (its own
completion log), in both stream modes and with the mode reported or not."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers.data import read_jsonl
from helpers.fidelity import check_against_log, prompts_covering_every_length
from helpers.fleet import shard_records
from helpers.task_harness import prompt_payload, run_task, sim_on_a_socket, worker_runtime

from genfleet.common.run_state import RunState

MAX_LENGTH = 200
INTERVAL = 32
MAX_NEW_TOKENS = 10240  # the short partition's default
# Streams at once: enough that chunks of several streams interleave on the worker's threads.
THREADS = 16


@pytest.mark.parametrize("mode", ["cumulative", "incremental", "incremental-unreported"])
def test_every_length_from_1_to_200_is_written_exactly_as_the_server_generated_it(
        mode, redis_url, redis_client, tmp_path, tokenizer):
    flags = ("--length-tokens", f"1:{MAX_LENGTH}", "--stream-interval", str(INTERVAL), "--spec-tokens", "3")
    numbers = prompts_covering_every_length(flags, MAX_LENGTH, MAX_NEW_TOKENS)
    log_path = tmp_path / "completions.jsonl"
    extra = {"cumulative": (), "incremental": ("--incremental",),
             "incremental-unreported": ("--incremental", "--no-server-info")}[mode]
    payloads = [prompt_payload(tokenizer, "lengths", "lengths", row, f"question {n}", keep_token_ids=True,
                               max_new_tokens=MAX_NEW_TOKENS) for row, n in enumerate(numbers)]
    with sim_on_a_socket(*flags, *extra, "--rate", "5000", "--log-completions", str(log_path)) as sim, \
            worker_runtime(redis_url, tmp_path / "out", sim.url, stream_interval=INTERVAL) as runtime, \
            ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(lambda payload: run_task(payload, runtime), payloads))
        runtime.shards.close()

    assert all(published == [] and "skipped" not in result for result, published in results)
    log = read_jsonl(log_path)
    assert sorted(line["completion_tokens"] for line in log) == list(range(1, MAX_LENGTH + 1))
    records = shard_records(tmp_path / "out", "lengths")
    assert len(records) == MAX_LENGTH
    check_against_log(records, log)
    assert RunState(redis_client, "lengths").completion_tokens("lengths") == sum(range(1, MAX_LENGTH + 1))
