"""The simulator's chunk cadence (SGLang 0.5.23's output streamer, with multi-token decode steps),
output ids through the stop token, exact completion lengths and the server settings its flags
give, property-tested without a server (tests/e2e/test_sim_stream_cadence.py checks the same over
HTTP)."""
from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from helpers.sim_in_process import parse_sim_args
from helpers.sim_plans import chunk_sizes, prompts
from hypothesis import given, settings
from hypothesis import strategies as st

from genfleet.sim.completion import REASONING_FORMAT_NAMES, CompletionPlan, LengthModel, plan_completion
from genfleet.sim.engine import DecodeSteps
from genfleet.sim.settings import SimSettings
from genfleet.sim.vocab import SimVocab

# -- an oracle: SGLang's streamer, step by step --------------------------------------------------


def sglang_stream_counts(total: int, interval: int, step_sizes: Iterator[int]) -> list[int]:
    """sglang 0.5.23 `output_streamer.py` `accept()`, run once per scheduler step: prefill gives one
    token, each decode step some more (cut at the stop token); a finished request always outputs."""
    generated, sent, counts = 1, 0, []
    while True:
        if generated >= total:
            counts.append(total)
            return counts
        unsent = generated - sent
        if interval == 1 or unsent >= interval or (sent == 0 and unsent > 0):
            counts.append(generated)
            sent = generated
        generated += next(step_sizes)


def step_sizes(steps: DecodeSteps, rng_seed: int) -> Iterator[int]:
    return (b - a for a, b in itertools.pairwise(steps.boundaries(rng_seed)))


@settings(max_examples=300, deadline=None)
@given(
    total=st.integers(1, 400),
    interval=st.integers(1, 20),
    low=st.integers(1, 6),
    extra=st.integers(0, 6),
    rng_seed=st.integers(0, 2**64 - 1),
)
def test_chunk_counts_follow_sglangs_streamer_for_any_steps(total, interval, low, extra, rng_seed):
    steps = DecodeSteps(low, low + extra)
    counts = steps.stream_counts(total, interval, rng_seed)
    assert counts == sglang_stream_counts(total, interval, step_sizes(steps, rng_seed))
    sizes = chunk_sizes(counts)
    assert sizes[0] == 1 and counts[-1] == total and all(size >= 1 for size in sizes)
    # Every non-final chunk after the first carries at least the interval; a step never overshoots
    # the interval by a whole step.
    assert all(interval <= size < interval + steps.high for size in sizes[1:-1])
    assert sizes[-1] < interval + steps.high if len(sizes) > 1 else sizes == [1]


@settings(max_examples=200, deadline=None)
@given(total=st.integers(1, 300), interval=st.integers(1, 12), step=st.integers(1, 7))
def test_fixed_steps_take_the_arithmetic_shortcut_to_the_same_counts(total, interval, step):
    steps = DecodeSteps(step, step)
    assert steps.stream_counts(total, interval, 0) == sglang_stream_counts(total, interval, itertools.repeat(step))


def test_several_tokens_per_step_make_chunks_pass_the_interval():
    assert DecodeSteps(3, 3).stream_counts(20, 4, 0) == [1, 7, 13, 19, 20]  # 6 per chunk, not 4
    assert DecodeSteps(1, 1).stream_counts(20, 4, 0) == [1, 5, 9, 13, 17, 20]
    spec = DecodeSteps(1, 4)
    assert spec.stream_counts(500, 3, 7) == spec.stream_counts(500, 3, 7)  # deterministic per seed
    assert spec.stream_counts(500, 3, 7) != spec.stream_counts(500, 3, 8)
    assert max(chunk_sizes(spec.stream_counts(500, 3, 7))[1:-1]) > 3
    with pytest.raises(ValueError):
        DecodeSteps(0, 1)


# -- completions: the stop id, exact lengths -----------------------------------------------------


def check_plan(plan: CompletionPlan, vocab: SimVocab) -> None:
    """The invariants of any completion: ids through the stop, text without it."""
    assert plan.completion_tokens == len(plan.output_ids)
    if plan.finish_reason["type"] == "stop":
        stop = plan.finish_reason["matched"]
        assert plan.output_ids[-1] == stop and stop not in plan.output_ids[:-1]
        assert plan.text_end == len(plan.output_ids) - 1
    else:
        assert plan.text_end == len(plan.output_ids)
    for skip in (False, True):
        assert plan.text(skip) == vocab.decode(plan.output_ids[: plan.text_end], skip_special_tokens=skip)
    assert plan.reasoning_text == vocab.decode(
        plan.output_ids[plan.reasoning_start : plan.reasoning_end], skip_special_tokens=False)
    assert plan.content_text == vocab.decode(
        plan.output_ids[plan.content_start : plan.text_end], skip_special_tokens=False)


@settings(max_examples=300, deadline=None)
@given(
    low=st.integers(1, 40),
    span=st.integers(0, 40),
    opening=st.integers(0, 2),
    word=st.integers(100, 2000),
    seed=st.integers(0, 2**32),
    fmt=st.sampled_from(REASONING_FORMAT_NAMES),
    share=st.sampled_from([0.0, 0.3, 0.7, 1.0]),
)
def test_exact_lengths_hold_for_every_format_opening_and_length(vocab, low, span, opening, word, seed, fmt, share):
    prompt = [word, *prompts(vocab, 3)[opening][1:]]  # inside reasoning, thinking off, model opens
    lengths = LengthModel(tokens=(low, low + span), reasoning_share=share)
    full = plan_completion(prompt, seed=seed, max_new_tokens=10_000, lengths=lengths, vocab=vocab,
                           reasoning_format=fmt)
    check_plan(full, vocab)
    assert full.finish_reason["type"] == "stop"
    assert low <= full.completion_tokens <= low + span
    if full.completion_tokens == 1:
        assert full.text(False) == "" and full.output_ids == [full.finish_reason["matched"]]
    # A smaller budget cuts the same completion, one short of the stop token at most.
    budget = (seed % full.completion_tokens) if full.completion_tokens > 1 else 0
    cut = plan_completion(prompt, seed=seed, max_new_tokens=budget, lengths=lengths, vocab=vocab,
                          reasoning_format=fmt)
    check_plan(cut, vocab)
    assert cut.output_ids == full.output_ids[:budget]
    assert cut.finish_reason == {"type": "length", "length": budget}
    # Exactly the budget: it stops, as a budget of the completion's length lets it.
    again = plan_completion(prompt, seed=seed, max_new_tokens=full.completion_tokens, lengths=lengths,
                            vocab=vocab, reasoning_format=fmt)
    assert again.output_ids == full.output_ids and again.finish_reason == full.finish_reason


@settings(max_examples=100, deadline=None)
@given(word=st.integers(100, 2000), seed=st.integers(0, 2**32), fmt=st.sampled_from(REASONING_FORMAT_NAMES),
       budget=st.integers(0, 300))
def test_lognormal_completions_keep_the_stop_id_too(vocab, word, seed, fmt, budget):
    plan = plan_completion([word, vocab.think_start_id], seed=seed, max_new_tokens=budget,
                           lengths=LengthModel(scale=0.05), vocab=vocab, reasoning_format=fmt)
    check_plan(plan, vocab)


def test_exact_lengths_cover_the_range_uniformly(vocab):
    lengths = LengthModel(tokens=(1, 6))
    seen = [plan_completion([i, 7], seed=0, max_new_tokens=100, lengths=lengths, vocab=vocab).completion_tokens
            for i in range(100, 700)]
    counts = [seen.count(n) for n in range(1, 7)]
    assert sum(counts) == 600 and min(counts) > 60  # 100 each on average


def test_parse_sim_args_gives_the_settings_a_server_runs_with():
    got = parse_sim_args(["--length-tokens", "3:9", "--spec-tokens", "4", "--stream-interval", "2", "--no-server-info",
                          "--drop-chunk-rate", "0.5", "--miscount-rate", "1", "--seed", "3"])
    assert got.lengths.tokens == (3, 9) and got.steps == DecodeSteps(1, 4) and got.stream_interval == 2
    assert (got.server_info, got.seed, got.faults.drop_chunk_rate, got.faults.miscount_rate) == (False, 3, 0.5, 1.0)
    assert parse_sim_args(["--tokens-per-step", "3", "--length-tokens", "5"]).steps == DecodeSteps(3, 3)
    assert parse_sim_args(["--length-tokens", "5"]).lengths.tokens == (5, 5)
    assert parse_sim_args([]) == SimSettings(port=0)

