"""`--on-truncated continue` against the real server: a completion cut at a small first cap is
continued from its own ids (prompt + every id so far as `input_ids`, on the long queue), and the
record is the plan with the whole budget, token for token and text for text, even where a cut fell
inside a multi-byte character.

What SGLang sends for each part (0.5.23) is why the worker's tokenizer matters there: the
detokenizer decodes a request's output with the last INIT_INCREMENTAL_DETOKENIZATION_OFFSET = 5
prompt tokens in front (`managers/schedule_batch.py::init_incremental_detokenize`: surr_offset =
read_offset - 5) and sends `decode(surr + output)[len(decode(surr)):]`
(`managers/detokenizer_manager.py::_decode_batch_token_id_output`). A continuation's text therefore
starts with whatever its first token carries (a word's leading space), but when the prompt (the
earlier part) ends inside a character, `decode(surr)` ends in U+FFFD standing for those bytes and
the slice drops the whole character: part one ends in "\ufffd" (a finished request flushes its
incomplete tail, `trim_matched_stop(decoded_text + new_text)`), part two starts after the character.
"""
from __future__ import annotations

import pytest
from helpers.data import write_jsonl
from plan import PlanVocab
from tier import Expectations, enqueue, start_pools

FIRST_CAP = 7  # the short partition's max_new_tokens: every plan here is longer
TOTAL = 160  # --max-new-tokens-total: above every finite plan here, below the endless one
SURR_OFFSET = 5  # 0.5.23 schedule_batch.py INIT_INCREMENTAL_DETOKENIZATION_OFFSET
# Content after a short reasoning (the cut lands in the content) and a longer reasoning (in it).
SHAPES = ("[plan len=30 think=3]", "[plan len=30 think=20]")
ENDLESS = "[plan forever think=10]"


def splits_a_character(vocab: PlanVocab, ids: list[int], cut: int) -> bool:
    """Whether cutting `ids` at `cut` splits the bytes of one character: the two halves, decoded
    apart, are not the whole decoded."""
    return vocab.decode(ids[:cut]) + vocab.decode(ids[cut:]) != vocab.decode(ids)


def pick_prompts(expect: Expectations, inside: int, between: int) -> tuple[list[str], list[str]]:
    """Prompts whose first cut falls inside a character (`inside` of them) and between characters
    (`between`), found by computing each candidate's plan: the cut positions are the plan's."""
    found: dict[bool, list[str]] = {True: [], False: []}
    wanted = {True: inside, False: between}
    for i in range(400):
        prompt = f"continue {i} {SHAPES[i % len(SHAPES)]}"
        ids = expect.output_ids({"messages": [{"role": "user", "content": prompt}]}, TOTAL)
        assert FIRST_CAP < len(ids) < TOTAL
        kind = splits_a_character(expect.vocab, ids, FIRST_CAP)
        if len(found[kind]) < wanted[kind]:
            found[kind].append(prompt)
        if all(len(found[k]) == wanted[k] for k in found):
            return found[True], found[False]
    raise AssertionError(f"not enough prompts of each kind among 400: {found}")


def run_continued(fleet, server, model, tmp_path, prompts: list[str], run: str):
    data = write_jsonl(tmp_path / "q.jsonl", [{"prompt": p} for p in prompts])
    start_pools(fleet, server.url, "short", "long")
    enqueue(fleet, model, run, f"q={data}",
            extra=("--keep-token-ids", "--on-truncated", "continue", "--max-new-tokens-short", str(FIRST_CAP),
                   "--max-new-tokens-long", str(TOTAL), "--max-new-tokens-total", str(TOTAL)))
    progress = fleet.wait_finished(run, timeout=180)
    assert progress.totals().done == len(prompts) and progress.totals().failed == 0
    written = fleet.records(run)
    records = {record["messages"][0]["content"]: record for record in written}
    assert len(written) == len(prompts) and sorted(records) == sorted(prompts)  # the parts wrote one record
    return records


@pytest.mark.parametrize("mode", ["cumulative", "incremental"])
def test_a_continued_completion_equals_the_plan_with_the_whole_budget_even_where_a_cut_splits_a_character(
        mode, servers, real_fleet, model, plan_vocab, tmp_path):
    server = servers[mode]
    real_fleet.configure(stream_interval=1, reasoning_parser="kimi_k2" if mode == "cumulative" else "deepseek-r1")
    expect = Expectations(model, plan_vocab)
    inside, between = pick_prompts(expect, inside=4, between=3)
    records = run_continued(real_fleet, server, model, tmp_path, [*inside, *between, ENDLESS], "cont")

    for prompt, record in records.items():
        ids = expect.output_ids(record, TOTAL)
        assert record["output_ids"] == ids, prompt
        assert (record["reasoning"], record["content"]) == expect.split(record, TOTAL), prompt
        assert record["continued"] == 1, prompt  # one follow-up: it had the whole rest of the budget
        assert record["partition"] == "long"  # written by the part that finished it
        usage = record["usage"]
        assert usage["completion_tokens"] == len(ids)
        assert usage["prompt_tokens"] == len(expect.prompt_ids(record))  # the prompt's, not the part's
        # The continuation's prefill came from the radix cache: the prompt and the first part's
        # ids but its last (whose KV the first request never computed).
        assert usage["cached_tokens"] >= usage["prompt_tokens"] + FIRST_CAP - 1, prompt
    for prompt in inside:
        assert splits_a_character(plan_vocab, records[prompt]["output_ids"], FIRST_CAP)
        assert "\ufffd" not in records[prompt]["reasoning"] + records[prompt]["content"]
    # Finite plans stop by themselves; the endless one is cut again at the total and kept as cut.
    assert {records[p]["finish_reason"] for p in [*inside, *between]} == {"stop"}
    assert records[ENDLESS]["finish_reason"] == "length"
    assert len(records[ENDLESS]["output_ids"]) == TOTAL


def server_text_joined(vocab: PlanVocab, prompt_ids: list[int], ids: list[int], cut: int) -> str:
    """The two parts' texts as SGLang 0.5.23 sends them, joined: part one's ids decoded (an incomplete
    character's bytes as U+FFFD), part two's decoded after the last 5 tokens of its prompt
    (`detokenizer_manager.py`: `read_text[len(surr_text):]`), its matched stop token trimmed."""
    first = vocab.decode(ids[:cut])
    surr = (prompt_ids + ids[:cut])[-SURR_OFFSET:]
    rest = ids[cut:-1] if ids[-1] == vocab.eos else ids[cut:]
    return first + vocab.decode(surr + rest)[len(vocab.decode(surr)):]


def test_without_the_workers_tokenizer_the_parts_texts_are_joined_and_a_split_character_is_lost(
        cumulative, real_fleet, model, plan_vocab, tmp_path):
    """The documented limit (docs/running.md, "Limits of these options"), as the real server
    shows it: each part's text is SGLang's own, so the character a cut split is one U+FFFD."""
    real_fleet.env.pop("GENFLEET_TOKENIZER")
    real_fleet.configure(stream_interval=8, reasoning_parser="kimi_k2")
    expect = Expectations(model, plan_vocab)
    inside, between = pick_prompts(expect, inside=2, between=2)
    records = run_continued(real_fleet, cumulative, model, tmp_path, [*inside, *between], "lossy")

    for prompt, record in records.items():
        ids = expect.output_ids(record, TOTAL)
        assert record["output_ids"] == ids, prompt  # the ids are joined exactly all the same
        joined = server_text_joined(plan_vocab, expect.prompt_ids(record), ids, FIRST_CAP)
        reasoning, marker, content = joined.partition("</think>")
        assert (record["reasoning"], record["content"]) == (reasoning, content), prompt
        exact = prompt in between
        assert (joined == expect.text(record, TOTAL)) is exact, prompt
        assert ("\ufffd" in joined) is not exact, prompt
