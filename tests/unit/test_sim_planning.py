"""The simulator's planner and its pure parts, without a server: completions cut and stopped
exactly, lengths as configured, who writes the think markers, the committed tokenizer, chunk
cadence and the occupancy the capacity model reports."""
from __future__ import annotations

import asyncio
import json
import statistics

import pytest
from helpers.sim_plans import FORMATS, plan

from genfleet.common.tokenizer import load_tokenizer
from genfleet.sim.build_model import EXTRA_SPECIAL_TOKENS, add_extra_special_tokens
from genfleet.sim.capacity import Capacity, CapacitySettings
from genfleet.sim.completion import LengthModel, Opening
from genfleet.sim.engine import DecodeSteps
from genfleet.sim.vocab import DEFAULT_TOKENIZER_DIR


def test_a_smaller_budget_cuts_the_same_completion(prompt, vocab):
    full = plan(prompt, vocab, max_new_tokens=10_000)
    for budget in (0, 1, 3, full.completion_tokens - 1):
        cut = plan(prompt, vocab, max_new_tokens=budget)
        assert cut.output_ids == full.output_ids[:budget]
        assert cut.finish_reason == {"type": "length", "length": budget}
        assert cut.completion_tokens == budget


def test_completion_lengths_follow_the_lognormal_median_and_mean(vocab):
    lengths = LengthModel(median=100, mean=150)
    words = [
        plan(f"prompt {i}", vocab, max_new_tokens=100_000, lengths=lengths).completion_tokens - 3
        for i in range(3000)
    ]
    assert statistics.median(words) == pytest.approx(100, rel=0.08)
    assert statistics.mean(words) == pytest.approx(150, rel=0.1)


@pytest.mark.parametrize(
    ("tail", "opening"),
    [("<think>", Opening.INSIDE_REASONING), ("<think></think>", Opening.THINKING_OFF), ("", Opening.MODEL_OPENS)],
)
def test_the_prompt_tail_decides_who_writes_the_think_markers(vocab, tail, opening):
    text_plan = plan("hello" + tail, vocab, max_new_tokens=10_000)
    ids_plan = plan(vocab.encode("hello" + tail), vocab, max_new_tokens=10_000)
    for p in (text_plan, ids_plan):
        assert p.opening is opening
        raw = p.text(skip_special_tokens=False)
        if opening is Opening.THINKING_OFF:
            assert "think>" not in raw and p.reasoning_text == "" and p.reasoning_tokens == 0
            assert raw == p.content_text
        else:
            opened = "<think>" if opening is Opening.MODEL_OPENS else ""
            assert raw == f"{opened}{p.reasoning_text}</think>{p.content_text}"
            assert p.reasoning_tokens == len(p.reasoning_text.split()) > 0
        assert p.text(skip_special_tokens=True) == p.reasoning_text + p.content_text


def test_a_stop_finish_sends_and_counts_the_eos_but_trims_its_text(prompt, vocab):
    p = plan(prompt, vocab, max_new_tokens=10_000)
    assert p.finish_reason == {"type": "stop", "matched": vocab.eos_id}
    # sglang 0.5.23 sends output_ids_through_stop and counts them; only the text is trimmed.
    assert p.output_ids[-1] == vocab.eos_id and vocab.eos_id not in p.output_ids[:-1]
    assert p.completion_tokens == len(p.output_ids) and p.text_end == len(p.output_ids) - 1
    assert "<|im_end|>" not in p.text(skip_special_tokens=False)
    assert p.text(skip_special_tokens=False) == vocab.decode(p.output_ids[:-1], skip_special_tokens=False)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_cut_anywhere_in_any_format_is_a_prefix_of_the_whole(vocab, fmt):
    for prompt in ("hello<think>", "hello"):
        full = plan(prompt, vocab, max_new_tokens=10_000, reasoning_format=fmt)
        whole = full.text(skip_special_tokens=False)
        for budget in range(full.completion_tokens):  # one short of the stop token
            cut = plan(prompt, vocab, max_new_tokens=budget, reasoning_format=fmt)
            assert cut.output_ids == full.output_ids[:budget]
            assert cut.finish_reason == {"type": "length", "length": budget}
            assert whole.startswith(cut.text(skip_special_tokens=False))  # may end inside a marker
            assert full.reasoning_text.startswith(cut.reasoning_text)
            assert full.content_text.startswith(cut.content_text)


def test_the_marker_tokens_come_after_the_trained_vocabulary_as_special_tokens(vocab):
    tokenizer = load_tokenizer(DEFAULT_TOKENIZER_DIR)  # AutoTokenizer, local files only
    assert tokenizer.convert_tokens_to_ids(["<|im_end|>", "<think>", "</think>"]) == [2, 7, 8]
    added = list(range(3000, 3000 + len(EXTRA_SPECIAL_TOKENS)))
    assert tokenizer.convert_tokens_to_ids(EXTRA_SPECIAL_TOKENS) == added
    assert set(EXTRA_SPECIAL_TOKENS) <= set(tokenizer.all_special_tokens)
    assert [vocab.special_id(token) for token in EXTRA_SPECIAL_TOKENS] == added
    assert tokenizer.decode(added, skip_special_tokens=True) == ""


def test_adding_the_marker_tokens_to_the_trained_tokenizer_gives_the_committed_one(tmp_path):
    committed = json.loads((DEFAULT_TOKENIZER_DIR / "tokenizer.json").read_text())
    trained = {**committed, "added_tokens": [t for t in committed["added_tokens"] if t["id"] < 3000]}
    (tmp_path / "tokenizer.json").write_text(json.dumps(trained))
    assert add_extra_special_tokens(tmp_path) == EXTRA_SPECIAL_TOKENS
    assert json.loads((tmp_path / "tokenizer.json").read_text()) == committed
    config = "tokenizer_config.json"
    assert (tmp_path / config).read_text() == (DEFAULT_TOKENIZER_DIR / config).read_text()
    assert add_extra_special_tokens(tmp_path) == []  # idempotent


def test_chunks_go_out_on_the_first_token_then_every_interval():
    steps = DecodeSteps()
    assert list(steps.chunk_counts(10, 4, 0)) == [1, 5, 9]
    assert list(steps.chunk_counts(9, 4, 0)) == [1, 5]
    assert list(steps.chunk_counts(1, 1, 0)) == []
    assert steps.stream_counts(10, 4, 0) == [1, 5, 9, 10]


def test_mean_running_is_the_time_weighted_occupancy():
    now = [0.0]
    capacity = Capacity(CapacitySettings(rate=100, knee=1), clock=lambda: now[0])

    async def scenario() -> None:
        await capacity.acquire()
        now[0] = 1.0
        assert capacity.progress() == pytest.approx(50.0)  # one running: 100 / (1 + 1)
        await capacity.acquire()
        now[0] = 2.0
        assert capacity.progress() == pytest.approx(50.0 + 100 / 3)  # two running: 100 / (1 + 2)
        capacity.release()
        capacity.release()
        now[0] = 4.0

    asyncio.run(scenario())
    stats = capacity.stats()
    assert stats.mean_running == pytest.approx((1 * 1 + 2 * 1 + 0 * 2) / 4)
    assert stats.peak_running == 2 and stats.running == 0
