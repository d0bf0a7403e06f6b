"""Records equal the plan, token for token and text for text, in both of SGLang's stream modes and
at stream intervals 1 and 8, read from the real server's stream."""
from __future__ import annotations

import pytest
from tier import Expectations, enqueue, write_plan_prompts

MAX_NEW_TOKENS = 10240  # the short partition's default: every plan stops by itself well before


@pytest.mark.parametrize("interval", [1, 8])
@pytest.mark.parametrize("mode", ["cumulative", "incremental"])
def test_every_record_equals_the_plan_token_for_token_in_both_stream_modes(
        mode, interval, servers, real_fleet, model, plan_vocab, tmp_path):
    server = servers[mode]
    parser = "kimi_k2" if mode == "cumulative" else "deepseek-r1"
    real_fleet.configure(stream_interval=interval, reasoning_parser=parser)
    data = write_plan_prompts(tmp_path / "q.jsonl", 30)
    real_fleet.start_worker("short", server.url, concurrency=16)
    enqueue(real_fleet, model, "modes", f"q={data}", extra=("--keep-token-ids",))
    progress = real_fleet.wait_finished("modes", timeout=180)
    assert progress.totals().done == 30 and progress.totals().failed == 0

    expect = Expectations(model, plan_vocab)
    records = real_fleet.records("modes")
    assert len(records) == 30
    for record in records:
        ids = expect.output_ids(record, MAX_NEW_TOKENS)
        assert record["output_ids"] == ids, record["id"]
        assert record["usage"]["completion_tokens"] == len(ids)
        assert (record["reasoning"], record["content"]) == expect.split(record, MAX_NEW_TOKENS), record["id"]
        assert record["finish_reason"] == "stop"
    assert any(ord(ch) > 0x7FF for record in records for ch in record["content"] + record["reasoning"])
