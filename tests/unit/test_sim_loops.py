"""Looping completions (`--loop-rate`, sim.completion), planned without a server: as many as the rate
says, periodic to the last id from where they start, never stopping, and every other completion
the same as without loops."""
from __future__ import annotations

import pytest
import typer
from helpers.sim_in_process import parse_sim_args
from helpers.sim_plans import FORMATS, LENGTHS
from hypothesis import given, settings
from hypothesis import strategies as st

from genfleet.sim.completion import NO_LOOPS, CompletionPlan, LengthModel, LoopModel, plan_completion
from genfleet.sim.vocab import SimVocab

PROMPT_TAILS = ([], [7], [7, 8])  # the model opens <think>; the prompt did; thinking off


def plan(
    prompt: list[int] | str,
    vocab: SimVocab,
    *,
    seed: int = 0,
    max_new_tokens: int = 128,
    lengths: LengthModel = LENGTHS,
    reasoning_format: str = "kimi_k2",
    loops: LoopModel = NO_LOOPS,
) -> CompletionPlan:
    """`helpers.sim_plans.plan`, with loops."""
    return plan_completion(prompt, seed=seed, max_new_tokens=max_new_tokens, lengths=lengths, vocab=vocab,
                           reasoning_format=reasoning_format, loops=loops)


def prompt_of(head: list[int], tail: int) -> list[int]:
    return [*head, *PROMPT_TAILS[tail]]


prompts = st.builds(prompt_of, st.lists(st.integers(9, 2999), max_size=4), st.integers(0, 2))
lengths = st.sampled_from([LENGTHS, LengthModel(scale=0.2), LengthModel(tokens=(1, 300)), LengthModel(tokens=(1, 6))])


@pytest.mark.parametrize("rate", [0.05, 0.3, 0.9])
def test_the_share_of_completions_that_loop_is_the_loop_rate(vocab, rate):
    loops = LoopModel(rate=rate)
    plans = [plan(f"prompt {i}", vocab, max_new_tokens=2000, loops=loops) for i in range(3000)]
    looping = [p for p in plans if p.loop_start is not None]
    assert len(looping) / len(plans) == pytest.approx(rate, abs=0.03)
    # A looping completion runs to the budget; at these short lengths nearly every other one stops.
    assert all(p.finish_reason == {"type": "length", "length": 2000} for p in looping)
    assert sum(not p.stopped for p in plans if p.loop_start is None) <= 5


@settings(max_examples=300, deadline=None)
@given(prompt=prompts, seed=st.integers(-(2**40), 2**40), budget=st.integers(0, 1500),
       fmt=st.sampled_from(FORMATS), lengths=lengths, rate=st.floats(0.0, 1.0))
def test_a_completion_that_does_not_loop_is_the_same_as_without_loops(vocab, prompt, seed, budget, fmt, lengths, rate):
    looped = plan(prompt, vocab, seed=seed, max_new_tokens=budget, lengths=lengths, reasoning_format=fmt,
                  loops=LoopModel(rate=rate))
    if looped.loop_start is None:
        assert looped == plan(prompt, vocab, seed=seed, max_new_tokens=budget, lengths=lengths, reasoning_format=fmt)


@settings(max_examples=300, deadline=None)
@given(prompt=prompts, seed=st.integers(0, 2**32), budget=st.integers(0, 900), fmt=st.sampled_from(FORMATS),
       lengths=lengths, start=st.integers(0, 300), period=st.integers(1, 40))
def test_a_loop_repeats_its_period_from_its_start_to_exactly_max_new_tokens(
        vocab, prompt, seed, budget, fmt, lengths, start, period):
    loops = LoopModel(rate=1.0, start=(start, start + 50), period=(period, period))
    looped = plan(prompt, vocab, seed=seed, max_new_tokens=budget, lengths=lengths, reasoning_format=fmt, loops=loops)
    ids, loop_start = looped.output_ids, looped.loop_start
    assert loop_start is not None and looped.loop_period == period
    assert len(ids) == budget and looped.finish_reason == {"type": "length", "length": budget}
    # Up to its start, the completion it would have been; after it, only the period's words.
    plain = plan(prompt, vocab, seed=seed, max_new_tokens=min(budget, loop_start), lengths=lengths,
                 reasoning_format=fmt)
    assert ids[:loop_start] == plain.output_ids
    assert all(ids[i] == ids[i - period] for i in range(loop_start + period, budget))
    assert set(ids[loop_start:]) <= set(vocab.word_ids)
    # It starts no later than where the stop token would have been, and never inside a marker.
    natural = plan(prompt, vocab, seed=seed, max_new_tokens=10**6, lengths=lengths, reasoning_format=fmt)
    assert loop_start <= natural.text_end
    for low, high in ((0, natural.reasoning_start), (natural.reasoning_end, natural.content_start)):
        assert not low < loop_start < high or natural.text_end < high


@settings(max_examples=200, deadline=None)
@given(prompt=prompts, seed=st.integers(0, 2**32), budgets=st.tuples(st.integers(0, 700), st.integers(0, 700)),
       fmt=st.sampled_from(FORMATS), lengths=lengths)
def test_a_smaller_budget_cuts_the_same_looping_completion(vocab, prompt, seed, budgets, fmt, lengths):
    small, large = sorted(budgets)
    kwargs = {"seed": seed, "lengths": lengths, "reasoning_format": fmt, "loops": LoopModel(rate=0.5, start=(0, 200))}
    cut = plan(prompt, vocab, max_new_tokens=small, **kwargs)
    whole = plan(prompt, vocab, max_new_tokens=large, **kwargs)
    assert cut.output_ids == whole.output_ids[:small]
    assert (cut.loop_start, cut.loop_period) == (whole.loop_start, whole.loop_period)
    assert whole.reasoning_text.startswith(cut.reasoning_text) and whole.content_text.startswith(cut.content_text)


def test_a_loop_that_begins_in_the_reasoning_never_closes_it(vocab):
    loops = LoopModel(rate=1.0, start=(5, 5), period=(3, 3))
    looped = plan("hello<think>", vocab, max_new_tokens=300, lengths=LengthModel(median=100, mean=101), loops=loops)
    assert looped.loop_start == 5 and vocab.think_end_id not in looped.output_ids
    assert (looped.reasoning_start, looped.reasoning_end, looped.content_start) == (0, 300, 300)
    assert looped.reasoning_tokens == 300 and looped.content_text == ""
    assert looped.reasoning_text == looped.text(skip_special_tokens=False)
    period = looped.reasoning_text.split()[5:8]
    assert looped.reasoning_text.split()[5:] == (period * 100)[:295]


def test_a_loop_that_begins_in_the_content_loops_the_answer(vocab):
    natural = plan("hello<think>", vocab, max_new_tokens=10_000)
    start = natural.content_start + 2
    looped = plan("hello<think>", vocab, max_new_tokens=500, loops=LoopModel(rate=1.0, start=(start, start)))
    assert looped.loop_start == start and looped.reasoning_text == natural.reasoning_text
    assert looped.content_start == natural.content_start and vocab.eos_id not in looped.output_ids
    content_ids = looped.output_ids[looped.content_start:]
    assert looped.content_text == vocab.decode(content_ids, skip_special_tokens=False)


def test_a_loop_drawn_inside_a_marker_starts_after_it(vocab):
    natural = plan("hello", vocab, max_new_tokens=10_000, reasoning_format="gpt-oss")
    assert natural.reasoning_start == 6  # <|channel|>analysis<|message|>: six tokens
    looped = plan("hello", vocab, max_new_tokens=100, reasoning_format="gpt-oss", loops=LoopModel(1.0, (4, 4), (3, 3)))
    assert looped.loop_start == 6
    closing = natural.reasoning_end + 2
    looped = plan("hello", vocab, max_new_tokens=100, reasoning_format="gpt-oss",
                  loops=LoopModel(1.0, (4, 4), (closing, closing)))
    assert looped.loop_start == natural.content_start


def test_a_completion_shorter_than_its_loop_start_loops_where_it_would_have_stopped(vocab):
    exact = LengthModel(tokens=(20, 20))
    natural = plan("hello<think>", vocab, max_new_tokens=1000, lengths=exact)
    looped = plan("hello<think>", vocab, max_new_tokens=1000, lengths=exact, loops=LoopModel(rate=1.0))
    assert natural.completion_tokens == 20 and looped.loop_start == 19
    assert looped.output_ids[:19] == natural.output_ids[:19] and looped.completion_tokens == 1000


def test_the_loop_flags_reach_the_plans_the_server_makes(vocab):
    flags = ["--loop-rate", "1", "--loop-period", "4:4", "--loop-start", "10:10", "--length-tokens", "30:40"]
    settings_ = parse_sim_args(flags)
    assert settings_.loops == LoopModel(rate=1.0, period=(4, 4), start=(10, 10))
    looped = settings_.plan([100, 200, 7], vocab=vocab, max_new_tokens=64)
    assert (looped.loop_start, looped.loop_period, looped.completion_tokens) == (10, 4, 64)
    assert parse_sim_args([]).loops == LoopModel()  # off unless asked


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--loop-period", "0:3", "need 1 <= LO <= HI"),
    ("--loop-start", "5:2", "need 0 <= LO <= HI"),
    ("--loop-start", "x", "expected LO:HI"),
    ("--loop-rate", "1.5", "less than or equal to 1"),
])
def test_bad_loop_flags_are_refused(flag, value, message):
    with pytest.raises(typer.BadParameter, match=message):
        parse_sim_args([flag, value])
