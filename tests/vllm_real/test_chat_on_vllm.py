"""`--api chat` on vLLM's own server: vLLM templates the messages and splits the reasoning with its
`--reasoning-parser` (`delta.reasoning`, where SGLang says `reasoning_content`); each record's
reasoning and content equal vLLM's own non-streamed chat answer."""
from __future__ import annotations

from helpers.data import write_jsonl

MAX_NEW_TOKENS = 40
PROMPTS = 12


def test_chat_records_equal_vllms_own_chat_answer(vllm, real_fleet, model, tmp_path):
    real_fleet.configure(api="chat", reasoning_parser="qwen3")
    data = write_jsonl(tmp_path / "q.jsonl", [{"prompt": f"chat {i}: name a prime above {i * 7}"}
                                               for i in range(PROMPTS)])
    real_fleet.start_worker("short", vllm.url, concurrency=8)
    real_fleet.genfleet("enqueue", "--run", "chat", "--tokenizer", str(model), "--temperature", "0",
                        "--max-new-tokens", str(MAX_NEW_TOKENS), f"q={data}")
    progress = real_fleet.wait_finished("chat", timeout=300)
    assert progress.totals().done == PROMPTS and progress.totals().failed == 0

    records = real_fleet.records("chat")
    assert len(records) == PROMPTS
    for record in records:
        answer = vllm.chat(record["messages"], MAX_NEW_TOKENS)
        message = answer["message"]
        assert record["reasoning"] == (message.get("reasoning") or ""), record["id"]
        assert record["content"] == (message.get("content") or ""), record["id"]
        assert record["finish_reason"] == answer["finish_reason"], record["id"]
        assert record["usage"]["completion_tokens"] > 0, record["id"]
