"""The reasoning/content split genfleet writes from `/generate` (its own splitter, on the ids) equals
the split the same real server makes itself: SGLang 0.5.23's `/v1/chat/completions` with its
`--reasoning-parser` (kimi_k2 on the cumulative server, deepseek-r1 on the incremental one), asked
for the same messages and `chat_template_kwargs`, non-streamed and streamed (`chat_oracle.py`).

Judged on the records on disk, for thinking on, thinking off (`--no-thinking`) and completions cut
by max_new_tokens inside the reasoning, the content or a multi-byte character."""
from __future__ import annotations

import pytest
from chat_oracle import CASES, ask, chat_many, generate
from tier import enqueue, start_pools, write_plan_prompts

PARSERS = {"cumulative": "kimi_k2", "incremental": "deepseek-r1"}


def split_of(record: dict) -> tuple[str, str]:
    return record["reasoning"], record["content"]


@pytest.mark.parametrize("mode", ["cumulative", "incremental"])
def test_records_split_reasoning_from_content_exactly_as_the_servers_own_parser_does(
        mode, servers, real_fleet, model, tmp_path):
    server = servers[mode]
    # Chunks of one token: stream boundaries fall inside multi-byte characters.
    real_fleet.configure(stream_interval=1, reasoning_parser=PARSERS[mode])
    runs = generate(real_fleet, model, server.url, tmp_path)

    for case in CASES:
        records = runs[case.name]
        whole = ask(server.url, case, records, stream=False)
        streamed = ask(server.url, case, records, stream=True)
        # The oracle agrees with itself: SGLang's streamed answer (the sum of its deltas, its usage
        # chunk) is its non-streamed one, split and counts, in every case here.
        assert streamed == whole, case.name
        for record, answer in zip(records, whole, strict=True):
            assert split_of(record) == answer.split, (case.name, record["id"])
            assert record["finish_reason"] == answer.finish_reason, (case.name, record["id"])
            assert record["usage"]["completion_tokens"] == answer.completion_tokens, (case.name, record["id"])
            usage = record["usage"]
            if case.name == "off" and PARSERS[mode] == "deepseek-r1":
                # SGLang disagrees with itself here: its split files the whole answer as reasoning,
                # its count says 0 (the chat endpoint asks `require_reasoning` only when the
                # template's toggle, `enable_thinking`, is on: 0.5.23 `serving_chat.py`
                # `_get_reasoning_from_request`). The record counts what its reasoning holds.
                assert usage["reasoning_tokens"] == usage["completion_tokens"] and answer.reasoning_tokens == 0
            else:
                assert usage["reasoning_tokens"] == answer.reasoning_tokens, (case.name, record["id"])

    on, off, cut = runs["on"], runs["off"], runs["cut"]
    # Not a vacuous comparison: both halves are there with thinking on, multi-byte ones among them.
    assert all(r["reasoning"] and r["content"] for r in on)
    assert any(ord(ch) > 0x7FF for r in on for ch in r["reasoning"])
    assert any(ord(ch) > 0x7FF for r in on for ch in r["content"])
    if PARSERS[mode] == "kimi_k2":
        # Thinking off: kimi_k2 reads the toggle, the whole answer is content.
        assert all(r["reasoning"] == "" and r["content"] for r in off)
    else:
        # deepseek-r1 has no toggle: SGLang forces reasoning whatever the kwargs say (0.5.23
        # `parser/reasoning_parser.py` DeepSeekR1Detector passes force_reasoning=True to its base),
        # so an answer without `</think>` is all reasoning there, and so in the records.
        assert all(r["content"] == "" and r["reasoning"] for r in off)
    # Cut inside the reasoning and inside the content; inside a character too: SGLang's text then
    # ends with U+FFFD (0.5.23 `managers/detokenizer_manager.py`: a finished request's text is decoded
    # once, incomplete tail included, where a streaming step holds it back), as genfleet's decoding
    # of the ids does.
    assert {r["finish_reason"] for r in cut} == {"length"}
    assert any(r["content"] == "" for r in cut) and any(r["content"] for r in cut)
    assert any((r["reasoning"] + r["content"]).endswith("\ufffd") for r in cut)


def test_a_continued_completion_counts_the_reasoning_tokens_the_server_counts_for_one_request(
        cumulative, real_fleet, model, tmp_path):
    """Cut at 7 tokens and continued (`--on-truncated continue`): where the reasoning is still open
    at the cut, the continuation asks SGLang to count on until `</think>`; where the first part
    closed it, the continuation counts none. Either way the record's count is the one SGLang gives
    a single request with the whole budget."""
    first_cap, total = 7, 160
    real_fleet.configure(stream_interval=1, reasoning_parser="kimi_k2")
    data = write_plan_prompts(tmp_path / "q.jsonl", 6, ("[plan len=20 think=15]", "[plan len=20 think=2]"),
                              stem="continued")
    start_pools(real_fleet, cumulative.url, "short", "long")
    enqueue(real_fleet, model, "cont", f"q={data}",
            extra=("--on-truncated", "continue", "--max-new-tokens-short", str(first_cap),
                   "--max-new-tokens-long", str(total), "--max-new-tokens-total", str(total)))
    progress = real_fleet.wait_finished("cont", timeout=120)
    assert progress.totals().done == 6 and progress.totals().failed == 0

    records = sorted(real_fleet.records("cont"), key=lambda record: record["row"])
    assert all(record["continued"] for record in records)  # every one was cut and continued
    whole = chat_many(cumulative.url, [record["messages"] for record in records], max_tokens=total)
    for record, answer in zip(records, whole, strict=True):
        assert (record["reasoning"], record["content"]) == answer.split, record["id"]
        assert record["usage"]["completion_tokens"] == answer.completion_tokens, record["id"]
        assert record["usage"]["reasoning_tokens"] == answer.reasoning_tokens, record["id"]
    # Both kinds of cut: inside the reasoning (more than the first part's 7 tokens of it) and after it.
    assert {answer.reasoning_tokens > first_cap for answer in whole} == {True, False}
