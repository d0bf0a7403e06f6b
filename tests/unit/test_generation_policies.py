"""The pure decisions behind `--on-truncated` and `--samples`: which follow-up a cut completion
gets, how parts join, which slot and seed each sample takes, and which option sets are refused."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from genfleet.common.records import TaskPayload
from genfleet.common.settings import Settings
from genfleet.producer.prompts import sample_payload, sample_seed, sample_slots
from genfleet.producer.run_config import CliOptions, ConfigError, DatasetSpec, resolve
from genfleet.workers.generation.replies import Continuation, follow_up, joined, prompt_with_prefix
from genfleet.workers.servers.api import Generation


def payload(**changes) -> TaskPayload:
    base = TaskPayload(run="r", id="d/1", dataset="d", row=1, partition="short", prompt_tokens=3,
                       max_new_tokens=100, messages=[{"role": "user", "content": "hi"}], input_ids=[1, 2, 3],
                       on_truncated="continue", max_new_tokens_total=1000)
    return replace(base, **changes)


def generation(ids: list[int], finish: str = "length", **changes) -> Generation:
    base = Generation(finish=finish, prompt_tokens=3, completion_tokens=len(ids),
                      reasoning_tokens=0, cached_tokens=0, first_token_s=0.1, duration_s=1.0,
                      text="".join(f"<{i}>" for i in ids), output_ids=ids)
    return replace(base, **changes)


def test_a_cut_completion_continues_on_long_with_what_is_left_of_the_total():
    next_part = follow_up(payload(), generation(list(range(100))), api="generate", started_at=5.0)
    assert next_part is not None and next_part.partition == "long"
    assert next_part.max_new_tokens == 900 and next_part.attempt == 1
    prior = Continuation.of(next_part)
    assert prior.output_ids == list(range(100)) and prior.parts == 1 and prior.started_at == 5.0
    assert prompt_with_prefix(next_part.input_ids, prior) == [1, 2, 3, *range(100)]


def test_parts_join_token_exact_and_count_every_part():
    first = follow_up(payload(), generation([7, 8]), api="generate", started_at=0.0)
    whole = joined(Continuation.of(first), generation([9], finish="stop", prompt_tokens=5))
    assert whole.output_ids == [7, 8, 9] and whole.text == "<7><8><9>"
    assert whole.completion_tokens == 3 and whole.prompt_tokens == 3  # the prompt's, not the prefix's
    second = follow_up(first, generation([9, 10], prompt_tokens=5), api="generate", started_at=1.0)
    assert Continuation.of(second).parts == 2 and Continuation.of(second).started_at == 0.0


@pytest.mark.parametrize("case", ["stopped", "loop", "keep", "spent", "regenerate-all", "server-cut"])
def test_no_follow_up(case):
    task, gen = payload(), generation(list(range(100)))
    if case == "stopped":
        gen = generation([1], finish="stop")
    elif case == "loop":
        gen = generation(list(range(100)), loop={"period": 5, "repeats": 20, "start": 0, "at_token": 100})
    elif case == "keep":
        task = payload(on_truncated="keep")
    elif case == "spent":
        task = payload(max_new_tokens_total=100)
    elif case == "server-cut":
        # SGLang lowered the budget to what its context left (granted_tokens 98 < 100): a follow-up's
        # prompt would be past its input bound and refused, losing what was generated.
        gen = generation(list(range(98)), granted_tokens=98)
    else:
        task = payload(regenerate="all")
    assert follow_up(task, gen, api="generate", started_at=0.0) is None


def test_a_cut_at_the_asked_budget_still_continues_when_the_server_reports_it():
    cut = generation(list(range(100)), granted_tokens=100)
    assert follow_up(payload(), cut, api="generate", started_at=0.0) is not None


def test_regenerate_asks_once_with_the_total_and_chat_falls_back_to_it():
    for task, api in ((payload(on_truncated="regenerate"), "generate"), (payload(), "chat")):
        again = follow_up(task, generation(list(range(100))), api=api, started_at=0.0)
        assert again.regenerated and again.max_new_tokens == 1000 and again.continuation is None
        assert follow_up(again, generation(list(range(1000))), api=api, started_at=0.0) is None


@given(st.integers(0, 10**6), st.integers(1, 16))
def test_sample_slots_never_collide_across_rows(row, samples):
    slots = sample_slots(row, samples)
    assert len(set(slots)) == samples and all(slot // samples == row for slot in slots)


def test_sample_seeds_are_stable_distinct_and_in_sglangs_range():
    seeds = [sample_seed("d/q1", k) for k in range(64)]
    assert len(set(seeds)) == 64 and all(0 <= s < 2**63 for s in seeds)
    assert seeds == [sample_seed("d/q1", k) for k in range(64)]
    assert sample_seed("d/q1", 0, base_seed=1) != seeds[0]
    task = sample_payload(payload(), slot=4 * 7 + 3, samples=4)
    assert (task.id, task.row, task.sample, task.prompt_id) == ("d/1#3", 31, 3, "d/1")
    assert task.sampling["sampling_seed"] == sample_seed("d/1", 3)


def options(**changes) -> CliOptions:
    return replace(CliOptions(datasets=(DatasetSpec("d", Path("d.jsonl")),), run="r", tokenizer="t"), **changes)


@pytest.mark.parametrize(("changes", "message"), [
    ({"samples": 4, "sampling": {"temperature": 0}}, "temperature 0"),
    ({"max_new_tokens_total": 10, "max_new_tokens": 100, "on_truncated": "continue"},
     "below the dataset's max_new_tokens"),
    ({"on_truncated": "continue", "regenerate": "all"}, "--regenerate all"),
    ({"loop_guard": "stop"}, "--loop-guard must be one of"),
    ({"on_truncated": "extend"}, "--on-truncated must be one of"),
])
def test_contradictory_options_are_refused_naming_the_flag(changes, message):
    with pytest.raises(ConfigError, match=message):
        resolve(options(**changes), None, Settings())


def test_defaults_keep_the_identity_of_runs_enqueued_before_these_options():
    dataset = resolve(options(), None, Settings()).datasets[0]
    assert (dataset.loop_guard, dataset.on_truncated, dataset.samples) == ("abort", "keep", 1)
    assert dataset.max_new_tokens_total == Settings().max_new_tokens_long
    assert not {"samples", "loop_guard", "on_truncated"} & set(dataset.identity())
    changed = resolve(options(samples=2, on_truncated="continue"), None, Settings()).datasets[0]
    assert changed.identity()["samples"] == 2 and changed.identity()["on_truncated"] == "continue"


@given(st.lists(st.integers(1, 5), max_size=200), st.integers(1, 70))
def test_samples_are_spread_sample_major_within_groups_and_none_is_lost(counts, group):
    from genfleet.producer.prompts import spread_samples

    per_prompt = [[(p, k) for k in range(n)] for p, n in enumerate(counts)]
    ordered = spread_samples(per_prompt, group)
    assert sorted(ordered) == sorted(t for tasks in per_prompt for t in tasks)
    for (p, k), (q, j) in zip(ordered, ordered[1:], strict=False):
        if p // group == q // group:
            assert (k, p) < (j, q)  # within a group: sample-major, prompts in order


def test_a_short_cap_above_the_long_one_still_works_when_nothing_is_continued():
    """A regression the review found: the total's check refused `--max-new-tokens-short 20000`."""
    dataset = resolve(options(max_new_tokens_short=20000), None, Settings()).datasets[0]
    assert dataset.max_new_tokens_total == 20000


def test_joined_text_is_the_decoding_of_the_joined_ids_when_the_tokenizer_is_at_hand():
    """A cut inside a multi-byte character: each part's server text misses part of it, the
    decoding of all the ids does not (the review's case: SGLang decodes each request on its own)."""
    pieces = {1: b"\xe4", 2: b"\xb8\xad", 3: b"!"}  # "中" split over ids 1 and 2

    def decode(ids: list[int]) -> str:
        return b"".join(pieces[i] for i in ids).decode("utf-8", errors="replace")

    first = follow_up(payload(), generation([1], text=decode([1])), api="generate", started_at=0.0)
    tail = generation([2, 3], finish="stop", text="\ufffd!")  # what a server decoding part 2 alone sends
    assert joined(Continuation.of(first), tail).text == "\ufffd\ufffd!"
    assert joined(Continuation.of(first), tail, decode=decode).text == "中!"


def test_loop_thresholds_out_of_range_are_refused_at_start():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="loop_min_repeats"):
        Settings(loop_min_repeats=1)
