"""Staged caps (`--first-max-new-tokens`) on SGLang's own server: each prompt's first request asks
a small cap, a completion cut there goes on exactly from its own ids, and every record is the one
a single request with the full cap gives: the same ids, the same text, the same finish, the same
split, even where the cut falls inside a multi-byte character. Only `continued` tells them apart."""
from __future__ import annotations

import pytest
from helpers.data import write_jsonl
from tier import Expectations, enqueue, start_pools

FIRST_CAP = 9
# Where the staged parts end: the first cap, then twice it more (18); twice that (36) would leave
# under 64 of the real cap, so the third part asks the rest (workers/generation/first_cap.py).
STAGE_ENDS = (9, 27)
FULL_CAP = 120  # the short partition's max_new_tokens: above every finite plan here
SHAPES = ("[plan len=4]", "[plan len=30 think=3]", "[plan len=60 think=20]", "[plan len=9]")
ENDLESS = "[plan forever think=10]"


@pytest.mark.parametrize("on_truncated", ["keep", "continue"])
def test_staged_caps_give_the_records_of_one_request_with_the_full_cap(
        on_truncated, cumulative, real_fleet, model, plan_vocab, tmp_path):
    real_fleet.configure(stream_interval=4, reasoning_parser="kimi_k2")
    prompts = [f"staged {i} {SHAPES[i % len(SHAPES)]}" for i in range(12)] + [ENDLESS]
    data = write_jsonl(tmp_path / "q.jsonl", [{"prompt": p} for p in prompts])
    start_pools(real_fleet, cumulative.url, "short", "long")
    enqueue(real_fleet, model, "staged", f"q={data}",
            extra=("--keep-token-ids", "--first-max-new-tokens", str(FIRST_CAP), "--max-new-tokens", str(FULL_CAP),
                   "--on-truncated", on_truncated))
    progress = real_fleet.wait_finished("staged", timeout=180)
    assert progress.totals().done == len(prompts) and progress.totals().failed == 0
    written = real_fleet.records("staged")
    records = {record["messages"][0]["content"]: record for record in written}
    assert len(written) == len(prompts) and sorted(records) == sorted(prompts)  # the parts wrote one record

    expect = Expectations(model, plan_vocab)
    for prompt, record in records.items():
        ids = expect.output_ids(record, FULL_CAP)
        assert record["output_ids"] == ids, prompt
        assert (record["reasoning"], record["content"]) == expect.split(record, FULL_CAP), prompt
        assert record["usage"]["completion_tokens"] == len(ids), prompt
        assert record["usage"]["prompt_tokens"] == len(expect.prompt_ids(record)), prompt
        # Cut at each stage it ran past, continued in its own queue; shorter plans asked once.
        stages_passed = sum(1 for end in STAGE_ENDS if len(ids) > end)
        assert record.get("continued") == (stages_passed or None), prompt
        assert record["partition"] == "short", prompt
    assert {r["finish_reason"] for p, r in records.items() if p != ENDLESS} == {"stop"}
    # The endless plan is cut at the full cap, and that cut is the dataset's own: kept as cut, or
    # (continue) gone on to --max-new-tokens-total, the long partition's cap by default.
    endless = records[ENDLESS]
    assert endless["finish_reason"] == "length"
    assert len(endless["output_ids"]) == FULL_CAP
