"""Records from vLLM's own server equal its own non-streamed output for the same prompt ids, token
for token and text for text: streamed over /v1/completions by a real worker, whole and staged
(a cut continued from its own ids), and N samples with their seeds."""
from __future__ import annotations

from answers import Oracle
from helpers.data import write_jsonl

PARSER = "qwen3"
MAX_NEW_TOKENS = 48
STAGED_CAP = 120  # room for two stages above the first cap of 9: 9, then 18 more, then the rest


def _prompts(tmp_path, count: int, stem: str = "question"):
    return write_jsonl(tmp_path / "q.jsonl", [{"prompt": f"{stem} {i}: tell me about byte {i * 37}"}
                                               for i in range(count)])


def test_every_record_equals_vllms_own_output(vllm, real_fleet, model, tmp_path):
    real_fleet.configure(reasoning_parser=PARSER, stream_interval=4)
    data = _prompts(tmp_path, 24)
    real_fleet.start_worker("short", vllm.url, concurrency=8)
    real_fleet.genfleet("enqueue", "--run", "exact", "--tokenizer", str(model), "--keep-token-ids",
                        "--temperature", "0", "--max-new-tokens", str(MAX_NEW_TOKENS), f"q={data}")
    progress = real_fleet.wait_finished("exact", timeout=300)
    assert progress.totals().done == 24 and progress.totals().failed == 0

    oracle = Oracle(vllm, model, PARSER)
    records = real_fleet.records("exact")
    assert len(records) == 24
    for record in records:
        answer = oracle.answer(record, MAX_NEW_TOKENS)
        assert record["output_ids"] == answer["token_ids"], record["id"]
        assert (record["reasoning"], record["content"]) == oracle.split(answer["text"]), record["id"]
        assert record["finish_reason"] == answer["finish_reason"], record["id"]
        assert record["usage"]["completion_tokens"] == len(answer["token_ids"]), record["id"]
        assert record["usage"]["prompt_tokens"] == len(oracle.prompt_ids(record)), record["id"]
    # The random model writes pieces of multi-byte characters too: the text still matches.
    assert any(ord(ch) > 0x7F for record in records for ch in record["reasoning"] + record["content"])


def test_a_staged_cut_continues_to_the_uncut_output(vllm, real_fleet, model, tmp_path):
    """`--first-max-new-tokens 9`: each prompt's first request asks 9 tokens, and a completion cut
    there goes on from the prompt ids plus its own ids; the record is the one request with the
    full cap gives."""
    real_fleet.configure(reasoning_parser=PARSER, stream_interval=4)
    data = _prompts(tmp_path, 10, stem="staged")
    real_fleet.start_worker("short", vllm.url, concurrency=8)
    real_fleet.genfleet("enqueue", "--run", "staged", "--tokenizer", str(model), "--keep-token-ids",
                        "--temperature", "0", "--first-max-new-tokens", "9", "--max-new-tokens", str(STAGED_CAP),
                        f"q={data}")
    progress = real_fleet.wait_finished("staged", timeout=300)
    assert progress.totals().done == 10 and progress.totals().failed == 0

    oracle = Oracle(vllm, model, PARSER)
    records = real_fleet.records("staged")
    assert len(records) == 10
    for record in records:
        answer = oracle.answer(record, STAGED_CAP)
        assert record["output_ids"] == answer["token_ids"], record["id"]
        assert (record["reasoning"], record["content"]) == oracle.split(answer["text"]), record["id"]
        # Cut at 9 and at 27 (a stage asks twice the last), then the rest (first_cap.py).
        assert record.get("continued") == (2 if len(answer["token_ids"]) > 27 else None), record["id"]


def test_samples_follow_their_seeds(vllm, real_fleet, model, tmp_path):
    """`--samples 3` at temperature 1: each sample carries its own seed; vLLM given that seed gives
    the same ids, and the samples of a prompt differ."""
    real_fleet.configure(reasoning_parser=PARSER)
    data = _prompts(tmp_path, 4, stem="sampled")
    real_fleet.start_worker("short", vllm.url, concurrency=8)
    real_fleet.genfleet("enqueue", "--run", "samples", "--tokenizer", str(model), "--keep-token-ids",
                        "--samples", "3", "--temperature", "1", "--max-new-tokens", "24", f"q={data}")
    progress = real_fleet.wait_finished("samples", timeout=300)
    assert progress.totals().done == 12 and progress.totals().failed == 0

    oracle = Oracle(vllm, model, PARSER)
    records = real_fleet.records("samples")
    by_prompt: dict[str, list[list[int]]] = {}
    for record in records:
        seed = record["sampling"]["sampling_seed"]
        answer = oracle.answer(record, 24, temperature=1, seed=seed)
        assert record["output_ids"] == answer["token_ids"], record["id"]
        by_prompt.setdefault(record["messages"][0]["content"], []).append(record["output_ids"])
    assert all(len({tuple(ids) for ids in samples}) == 3 for samples in by_prompt.values())
