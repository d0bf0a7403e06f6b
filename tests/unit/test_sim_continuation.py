"""Continuing a cut completion (sim.completion) and aborting requests in flight (sim.engine),
without a server: a continuation's tail after the prefix is the longer completion, the map of cuts
forgets the oldest, /abort_request's rid matching, and slots freed however a waiter goes."""
from __future__ import annotations

import asyncio

import pytest
from helpers.sim_plans import FORMATS, plan_continuation
from hypothesis import given, settings
from hypothesis import strategies as st

from genfleet.sim.capacity import Capacity, CapacitySettings
from genfleet.sim.completion import Cut, CutCompletions, LengthModel, LoopModel, Opening
from genfleet.sim.engine import ABORTED, ABORTED_WHILE_WAITING, InFlight, RequestControl
from genfleet.sim.settings import SimSettings

PROMPTS = ([100, 200], [100, 200, 7], [100, 200, 7, 8], "hello<think>")


@settings(max_examples=300, deadline=None)
@given(prompt=st.sampled_from(PROMPTS), seed=st.integers(0, 2**32), generated=st.integers(1, 400),
       more=st.integers(0, 400), fmt=st.sampled_from(FORMATS),
       lengths=st.sampled_from([LengthModel(scale=0.2), LengthModel(tokens=(1, 500))]),
       loop_rate=st.sampled_from([0.0, 0.5]))
def test_a_continuation_after_its_prefix_is_the_completion_of_the_larger_budget(
        vocab, prompt, seed, generated, more, fmt, lengths, loop_rate):
    sim = SimSettings(port=0, lengths=lengths, reasoning_format=fmt, loops=LoopModel(loop_rate, start=(0, 300)))
    prefix = sim.plan(prompt, vocab=vocab, seed=seed, max_new_tokens=generated)
    whole = sim.plan(prompt, vocab=vocab, seed=seed, max_new_tokens=generated + more)
    tail = plan_continuation(sim, prompt, vocab=vocab, seed=seed, generated=generated, max_new_tokens=more)
    if prefix.stopped:
        return  # finished by its stop token: nothing to continue
    assert prefix.output_ids + tail.output_ids == whole.output_ids
    assert prefix.reasoning_text + tail.reasoning_text == whole.reasoning_text
    assert prefix.content_text + tail.content_text == whole.content_text
    assert prefix.reasoning_tokens + tail.reasoning_tokens == whole.reasoning_tokens
    assert tail.completion_tokens == len(tail.output_ids) <= more
    expected_finish = whole.finish_reason if whole.stopped else {"type": "length", "length": more}
    assert tail.finish_reason == expected_finish
    assert tail.rng_seed == whole.rng_seed and tail.loop_period == whole.loop_period


def test_a_continuation_inside_the_reasoning_closes_it_later(vocab):
    sim = SimSettings(port=0, lengths=LengthModel(median=60, mean=61))
    prompt = [100, 200, 7]
    whole = sim.plan(prompt, vocab=vocab, max_new_tokens=1000)
    generated = whole.reasoning_end - 10
    tail = plan_continuation(sim, prompt, vocab=vocab, generated=generated, max_new_tokens=1000 - generated)
    assert (tail.reasoning_start, tail.reasoning_end) == (0, 10) and tail.output_ids[10] == vocab.think_end_id
    assert tail.content_text == whole.content_text and tail.stopped


def test_a_cut_is_found_by_its_ids_and_the_oldest_is_forgotten():
    cuts = CutCompletions(max_entries=2)
    first, second, third = (Cut(rid, 1, Opening.MODEL_OPENS, 3) for rid in ("a", "b", "c"))
    assert cuts.find([1, 2, 3]) is None
    cuts.remember([1, 2], [3], first)
    cuts.remember([1, 2], [4], second)
    assert cuts.find([1, 2, 3]) is first and cuts.find([1, 2]) is None
    cuts.remember([9], [9], third)  # "a" was used last: "b" goes
    assert (cuts.find([1, 2, 3]), cuts.find([1, 2, 4]), cuts.find([9, 9])) == (first, None, third)
    assert len(cuts) == 2


def test_abort_request_matches_rid_prefixes_of_a_held_rid_or_all():
    async def aborted_by(rid: str | None, abort_all: bool = False) -> set[str]:
        capacity = Capacity(CapacitySettings())
        held = InFlight()
        controls = [RequestControl(rid, stream=True, capacity=capacity, disconnect_abort_s=2.0)
                    for rid in ("req", "req-2", "other")]
        for control in controls:
            held.add(control)
        held.abort_request(rid, abort_all)
        return {control.rid for control in controls if control.aborted}

    # The tokenizer manager sends a rid it holds; the scheduler aborts every rid that starts with it.
    assert asyncio.run(aborted_by("req")) == {"req", "req-2"}
    assert asyncio.run(aborted_by("re")) == set()  # not held: ignored
    assert asyncio.run(aborted_by("")) == set() and asyncio.run(aborted_by(None)) == set()
    assert asyncio.run(aborted_by(None, abort_all=True)) == {"req", "req-2", "other"}


@pytest.mark.parametrize("waiter_first", [False, True])
def test_an_abort_frees_the_slot_at_once_and_counts_what_was_decoded(waiter_first):
    async def scenario() -> tuple[RequestControl, RequestControl, Capacity]:
        capacity = Capacity(CapacitySettings(max_running=1))
        running = RequestControl("a", stream=True, capacity=capacity, disconnect_abort_s=2.0)
        waiting = RequestControl("b", stream=True, capacity=capacity, disconnect_abort_s=2.0)
        assert await running.take_slot()
        queued = asyncio.ensure_future(waiting.take_slot())
        while not capacity.waiting:  # its acquire starts a turn or two later
            await asyncio.sleep(0)
        assert (capacity.running, capacity.waiting) == (1, 1)
        running.start_decoding(_Decoded(40), end=100)
        running.record_decoded(30)
        # In the same turn, in either order: the freed slot is neither lost nor freed twice.
        for control in (waiting, running) if waiter_first else (running, waiting):
            control.abort()
        assert not await queued
        return running, waiting, capacity

    running, waiting, capacity = asyncio.run(scenario())
    assert (running.abort_finish, running.decoded_at_abort) == (ABORTED, 40)
    assert (waiting.abort_finish, waiting.decoded_at_abort) == (ABORTED_WHILE_WAITING, 0)
    stats = capacity.stats()
    assert (stats.running, stats.waiting, stats.aborted_requests, stats.tokens_generated) == (0, 0, 2, 40)


class _Decoded:
    def __init__(self, count: int) -> None:
        self.count = count

    def ready(self, limit: int) -> int:
        return min(limit, self.count)
