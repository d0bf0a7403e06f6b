"""The producer's pure parts: rows of each shape become chat messages, a row without a user turn is
rejected with its reason, prompt ids, and the partition a prompt goes to."""
from __future__ import annotations

import pytest

from genfleet.producer.prompts import RowRejected, choose_partition, prompt_id, prompt_messages, read_row
from genfleet.producer.run_config import DatasetSpec


def test_sharegpt_and_openai_rows_become_chat_messages():
    sharegpt = {"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "q"},
                                  {"from": "gpt", "value": "a"}]}
    assert prompt_messages(read_row(sharegpt).messages) == [{"role": "system", "content": "s"},
                                                            {"role": "user", "content": "q"}]
    openai = {"messages": [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"},
                           {"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}]}
    assert [m["content"] for m in prompt_messages(read_row(openai).messages)] == ["q1", "a1", "q2"]
    assert read_row({"prompt": "hi"}).messages == [{"role": "user", "content": "hi"}]


def test_row_without_user_turn_is_rejected_with_reason():
    with pytest.raises(RowRejected, match="no user turn"):
        prompt_messages(read_row({"messages": [{"role": "assistant", "content": "a"}]}).messages)


def test_prompt_ids_use_the_rows_own_id_else_its_index():
    assert prompt_id("B1", {"id": "x-1"}, 7) == "B1/x-1"
    assert prompt_id("B1", {"custom_id": "req-3"}, 7) == "B1/req-3"
    assert prompt_id("B1", {}, 7) == "B1/7"


def test_partition_by_pin_or_by_total_token_need():
    assert choose_partition(10, pinned="long", max_new_tokens_short=100, long_threshold=1000) == "long"
    assert choose_partition(950, pinned=None, max_new_tokens_short=100, long_threshold=1000) == "long"
    assert choose_partition(900, pinned=None, max_new_tokens_short=100, long_threshold=1000) == "short"
    assert DatasetSpec.parse("B8=data/b8.jsonl:long").pinned == "long"
    assert DatasetSpec.parse("B1=data/b1.jsonl").pinned is None
