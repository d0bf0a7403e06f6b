"""`genfleet enqueue` with a Kimi-K2-shaped tokenizer directory (tests/model_shapes: tiktoken ranks,
`tokenization_kimi.py` behind `auto_map`, no `tokenizer.json`): refused in one line without
`--trust-remote-code`, and with it the ids it publishes are the tokenizer's own
`apply_chat_template` + encode, thinking on and off, in a batch large enough to be templated in
processes (producer/templating_processes.py)."""
from __future__ import annotations

import pytest
from helpers.data import write_jsonl
from helpers.model_shapes import CONVERSATIONS, shape_dir
from helpers.producer_cli import all_payloads, enqueue

from genfleet.common.tokenizer import load_tokenizer

# The first batch (128 rows) starts the templating processes; the second (172) is templated in them.
ROWS = 300


def _rows() -> list[dict]:
    return [{"id": f"r{i}", "messages": CONVERSATIONS[i % len(CONVERSATIONS)]} for i in range(ROWS)]


def test_without_the_flag_a_dry_run_is_refused_in_one_line_naming_it(redis_url, tmp_path):
    data = write_jsonl(tmp_path / "k.jsonl", _rows())
    result = enqueue(redis_url, "--tokenizer", str(shape_dir("kimi-k2.5")), "--dry-run", f"k={data}",
                     expect_exit=2)
    output = (result.stdout + result.stderr).strip()
    named = [line for line in output.splitlines() if "--trust-remote-code" in line]
    assert len(named) == 1 and "tokenization_kimi.py" in named[0], output
    assert "Traceback" not in output
    enqueue(redis_url, "--tokenizer", str(shape_dir("kimi-k2.5")), "--trust-remote-code", "--dry-run", f"k={data}")


@pytest.mark.parametrize("thinking", ["--thinking", "--no-thinking"])
def test_with_the_flag_the_published_ids_are_the_tokenizers_own(redis_url, redis_client, tmp_path, thinking):
    rows = _rows()
    data = write_jsonl(tmp_path / "k.jsonl", rows)
    directory = shape_dir("kimi-k2.5")
    enqueue(redis_url, "--tokenizer", str(directory), "--trust-remote-code", thinking, "--context-length", "131072",
            f"k={data}", run=f"kimi{thinking}")
    payloads = all_payloads(redis_client)
    own = load_tokenizer(directory, trust_remote_code=True)
    for row in rows:
        expected = own.apply_chat_template(row["messages"], tokenize=True, add_generation_prompt=True,
                                           return_dict=False, thinking=thinking == "--thinking")
        assert payloads[f"k/{row['id']}"]["input_ids"] == list(expected), row["id"]
