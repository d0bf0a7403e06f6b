"""Export formats and sinks on their own, without a run: the tokenized format's loss mask for a
truncated turn, thinking off and regenerated multi-turn records; the bucket shuffle's spill files."""
from __future__ import annotations

import pytest
from helpers.paths import TOKENIZER

from genfleet.common.tokenizer import load_tokenizer, render_prompts
from genfleet.export.formats import TokenizedFormat, specforge_line
from genfleet.export.sinks import BucketShuffle
from genfleet.sim.completion import LengthModel, plan_completion
from genfleet.sim.vocab import SimVocab


def _tokenized(messages: list[dict], max_new_tokens: int, kwargs: dict | None = None,
               keep_ids: bool = True) -> tuple[dict, list[int], object]:
    tokenizer = load_tokenizer(TOKENIZER)
    vocab = SimVocab.from_tokenizer_dir(TOKENIZER)
    (prompt,) = render_prompts(tokenizer, [messages], kwargs)
    plan = plan_completion(prompt, seed=0, max_new_tokens=max_new_tokens, lengths=LengthModel(scale=0.05),
                           vocab=vocab)
    record = {"id": "d/0", "dataset": "d", "messages": messages, "reasoning": plan.reasoning_text,
              "content": plan.content_text, "finish_reason": plan.finish_reason["type"],
              "matched_stop": plan.finish_reason.get("matched"), "usage": {}}
    if keep_ids:
        record["output_ids"] = plan.output_ids
    return TokenizedFormat(tokenizer, {"d": kwargs or {}})(record), prompt, plan


@pytest.mark.parametrize("keep_ids", [True, False], ids=["output_ids", "text"])
def test_tokenized_truncated_turn_ends_at_its_last_generated_token(keep_ids):
    messages = [{"role": "user", "content": "explain the module loader in detail please"}]
    line, prompt, plan = _tokenized(messages, max_new_tokens=6, keep_ids=keep_ids)
    assert plan.finish_reason["type"] == "length"
    assert line["input_ids"] == prompt + plan.output_ids  # no </think>, no <|im_end|>: never generated
    assert line["loss_mask"] == [0] * len(prompt) + [1] * len(plan.output_ids)


@pytest.mark.parametrize("keep_ids", [True, False], ids=["output_ids", "text"])
def test_tokenized_thinking_off_masks_content_and_end_of_turn_only(keep_ids):
    messages = [{"role": "user", "content": "a quick answer please"}]
    line, prompt, plan = _tokenized(messages, 200, {"thinking": False}, keep_ids=keep_ids)
    tokenizer = load_tokenizer(TOKENIZER)
    assert plan.reasoning_text == ""
    assert tokenizer.decode(prompt[-2:], skip_special_tokens=False) == "<think></think>"  # the template's
    generated = [i for i, m in zip(line["input_ids"], line["loss_mask"], strict=True) if m]
    assert tokenizer.decode(generated, skip_special_tokens=False) == plan.content_text + "<|im_end|>"
    assert line["input_ids"][: len(prompt)] == prompt and not any(line["loss_mask"][: len(prompt)])


def test_regenerate_all_interleaves_the_generated_turns_and_tokenized_masks_each():
    tokenizer = load_tokenizer(TOKENIZER)
    turns = [{"reasoning": f" thought {i}", "content": f" answer {i}", "finish_reason": "stop",
              "matched_stop": tokenizer.convert_tokens_to_ids("<|im_end|>")} for i in range(2)]
    record = {"id": "m/0", "dataset": "m", "usage": {}, "reasoning": turns[-1]["reasoning"],
              "content": turns[-1]["content"], "finish_reason": "stop", "turns": turns,
              "messages": [{"role": "user", "content": "first question"},
                           {"role": "assistant", "content": " answer 0"},
                           {"role": "user", "content": "second question"}]}
    assert specforge_line(record)["conversations"] == [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": " answer 0", "reasoning_content": " thought 0"},
        {"role": "user", "content": "second question"},
        {"role": "assistant", "content": " answer 1", "reasoning_content": " thought 1"}]
    line = TokenizedFormat(tokenizer)(record)
    spans, current = [], []
    for token, mask in zip(line["input_ids"], line["loss_mask"], strict=True):
        if mask:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    spans.append(current)
    assert [tokenizer.decode(span, skip_special_tokens=False) for span in spans] == [
        " thought 0</think> answer 0<|im_end|>", " thought 1</think> answer 1<|im_end|>"]
    unmasked = tokenizer.decode([t for t, m in zip(line["input_ids"], line["loss_mask"], strict=True) if not m],
                                skip_special_tokens=False)
    assert "first question" in unmasked and "second question" in unmasked and "answer" not in unmasked


def test_bucket_shuffle_keeps_every_line_once_when_buckets_overflow_and_split(tmp_path):
    shuffle = BucketShuffle(tmp_path, expected_bytes=100, max_bucket_bytes=2000, seed=3)
    sent = [(i % 3, f"line {i}\n".encode()) for i in range(3000)]
    for tag, line in sent:
        shuffle.add(tag, line)
    received = list(shuffle.drain())
    assert sorted(received) == sorted(sent) and received != sent
    assert not list(tmp_path.iterdir())  # bucket files are gone
    # Every line lands anywhere: the first tenth spreads over the whole output.
    positions = sorted(received.index(item) for item in sent[:300])
    assert positions[0] < 300 and positions[-1] > 2700
