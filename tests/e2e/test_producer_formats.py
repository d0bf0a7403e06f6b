"""One test per input format: the prompts and ids each yields, read through `genfleet enqueue`."""
import gzip
import json

import pytest
from helpers.data import write_jsonl
from helpers.producer_cli import all_payloads, enqueue

CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": "4"}]
PROMPT = CONVERSATION[:2]  # the reply after the last user turn is what gets generated


def test_openai_messages_rows_use_their_own_ids_else_the_row_index(redis_url, redis_client, tmp_path):
    data = write_jsonl(tmp_path / "m.jsonl", [{"id": "first", "messages": CONVERSATION},
                                               {"messages": CONVERSATION[:2]}])
    enqueue(redis_url, f"m={data}")
    payloads = all_payloads(redis_client)
    assert set(payloads) == {"m/first", "m/1"}
    assert payloads["m/first"]["messages"] == PROMPT and payloads["m/1"]["messages"] == PROMPT
    assert payloads["m/first"]["row"] == 0 and payloads["m/1"]["row"] == 1


def test_sharegpt_rows_with_from_value_or_role_content(redis_url, redis_client, tmp_path):
    from_value = [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "What is 2+2?"},
                  {"from": "gpt", "value": "4"}]
    role_content = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
    data = write_jsonl(tmp_path / "s.jsonl", [{"conversations": from_value}, {"id": 7, "conversations": role_content}])
    enqueue(redis_url, f"s={data}", "--format", "sharegpt")
    payloads = all_payloads(redis_client)
    assert set(payloads) == {"s/0", "s/7"}
    assert payloads["s/0"]["messages"] == PROMPT and payloads["s/7"]["messages"] == PROMPT


def test_plain_prompt_rows_and_a_chosen_prompt_field(redis_url, redis_client, tmp_path):
    data = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Say hi"}, {"prompt": "Say bye", "id": "x"}])
    enqueue(redis_url, f"p={data}")
    other = write_jsonl(tmp_path / "q.jsonl", [{"question": "Why?"}])
    enqueue(redis_url, f"q={other}", "--format", "prompt", "--prompt-field", "question")
    payloads = all_payloads(redis_client)
    assert payloads["p/0"]["messages"] == [{"role": "user", "content": "Say hi"}]
    assert payloads["p/x"]["messages"] == [{"role": "user", "content": "Say bye"}]
    assert payloads["q/0"]["messages"] == [{"role": "user", "content": "Why?"}]


def test_openai_batch_lines_use_custom_id_and_their_max_tokens_capped_by_the_partition(redis_url, redis_client,
                                                                                      tmp_path):
    def line(custom_id, max_tokens=None):
        body = {"model": "m", "messages": PROMPT, **({"max_tokens": max_tokens} if max_tokens else {})}
        return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}

    data = write_jsonl(tmp_path / "b.jsonl", [line("req-1", 50), line("req-2", 5000), line("req-3")])
    enqueue(redis_url, f"b={data}", "--max-new-tokens-short", "300")
    payloads = all_payloads(redis_client)
    assert set(payloads) == {"b/req-1", "b/req-2", "b/req-3"}
    assert payloads["b/req-1"]["messages"] == PROMPT
    assert [payloads[f"b/req-{i}"]["max_new_tokens"] for i in (1, 2, 3)] == [50, 300, 300]


def test_gzip_and_zstd_jsonl_read_like_plain_jsonl(redis_url, redis_client, tmp_path):
    import zstandard

    rows = "".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(3)).encode()
    (tmp_path / "g.jsonl.gz").write_bytes(gzip.compress(rows))
    (tmp_path / "z.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(rows))
    enqueue(redis_url, f"g={tmp_path / 'g.jsonl.gz'}", f"z={tmp_path / 'z.jsonl.zst'}")
    payloads = all_payloads(redis_client)
    assert set(payloads) == {f"{name}/{i}" for name in "gz" for i in range(3)}
    assert payloads["z/2"]["messages"] == [{"role": "user", "content": "q2"}]


def test_a_glob_counts_rows_across_its_files_in_sorted_order(redis_url, redis_client, tmp_path):
    (tmp_path / "shards").mkdir()
    write_jsonl(tmp_path / "shards" / "part-2.jsonl", [{"prompt": "c"}])
    write_jsonl(tmp_path / "shards" / "part-1.jsonl", [{"prompt": "a"}, {"prompt": "b"}])
    enqueue(redis_url, f"g={tmp_path / 'shards' / 'part-*.jsonl'}")
    payloads = all_payloads(redis_client)
    assert {k: v["messages"][0]["content"] for k, v in payloads.items()} == {"g/0": "a", "g/1": "b", "g/2": "c"}


def test_parquet_rows_become_prompts(redis_url, redis_client, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet", reason="the [parquet] extra is not installed")
    import pyarrow as pa

    table = pa.Table.from_pylist([{"id": "a", "messages": CONVERSATION}, {"id": None, "messages": PROMPT}])
    pq.write_table(table, tmp_path / "d.parquet")
    enqueue(redis_url, f"pq={tmp_path / 'd.parquet'}")
    payloads = all_payloads(redis_client)
    assert set(payloads) == {"pq/a", "pq/1"}
    assert payloads["pq/a"]["messages"] == PROMPT and payloads["pq/1"]["messages"] == PROMPT


def test_a_saved_hugging_face_dataset_becomes_prompts(redis_url, redis_client, tmp_path):
    datasets = pytest.importorskip("datasets", reason="the [hf] extra is not installed")
    sharegpt = [{"from": "human", "value": "What is 2+2?"}, {"from": "gpt", "value": "4"}]
    dataset = datasets.Dataset.from_list([{"conversations": sharegpt}, {"conversations": sharegpt[:1]}])
    dataset.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": dataset}).save_to_disk(str(tmp_path / "dict"))
    enqueue(redis_url, f"hf={tmp_path / 'saved'}")
    payloads = all_payloads(redis_client)
    assert set(payloads) == {"hf/0", "hf/1"}
    assert payloads["hf/0"]["messages"] == [{"role": "user", "content": "What is 2+2?"}]
    # A DatasetDict: told to point at one split.
    result = enqueue(redis_url, f"hf2={tmp_path / 'dict'}", expect_exit=2)
    assert "DatasetDict with splits ['train']" in result.stderr
