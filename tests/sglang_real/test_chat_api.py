"""`GENFLEET_API=chat`: the workers stream `/v1/chat/completions` and the server splits reasoning
itself; each record on disk holds what the same real server answers for its messages when asked
whole (`chat_oracle.py`): reasoning, content, finish reason and completion tokens. For thinking on,
thinking off (`--no-thinking`, sent as `chat_template_kwargs`) and completions cut by max_new_tokens."""
from __future__ import annotations

import pytest
from chat_oracle import CASES, ask, generate
from tier import Expectations

PARSERS = {"cumulative": "kimi_k2", "incremental": "deepseek-r1"}


@pytest.mark.parametrize("mode", ["cumulative", "incremental"])
def test_chat_api_records_hold_the_servers_own_split_finish_reason_and_token_count(
        mode, servers, real_fleet, model, plan_vocab, tmp_path):
    server = servers[mode]
    real_fleet.configure(api="chat", reasoning_parser=PARSERS[mode])
    runs = generate(real_fleet, model, server.url, tmp_path)

    for case in CASES:
        records = runs[case.name]
        expect = Expectations(model, plan_vocab, case.chat_template_kwargs)
        for record, answer in zip(records, ask(server.url, case, records, stream=False), strict=True):
            assert (record["reasoning"], record["content"]) == answer.split, (case.name, record["id"])
            assert record["finish_reason"] == answer.finish_reason, (case.name, record["id"])
            assert record["usage"]["completion_tokens"] == answer.completion_tokens, (case.name, record["id"])
            assert record["usage"]["reasoning_tokens"] == answer.reasoning_tokens, (case.name, record["id"])
            # The oracle ran the plan (the server templated the messages as the producer did).
            assert answer.completion_tokens == len(expect.output_ids(record, case.max_new_tokens)), record["id"]
            assert "output_ids" not in record  # the chat API has no ids to keep

    on = runs["on"]
    assert all(r["reasoning"] and r["content"] for r in on)
    assert any(ord(ch) > 0x7FF for r in on for ch in r["reasoning"] + r["content"])
    assert {r["finish_reason"] for r in runs["cut"]} == {"length"}
    assert any((r["reasoning"] + r["content"]).endswith("\ufffd") for r in runs["cut"])  # cut inside a character
