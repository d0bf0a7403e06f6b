"""Staged caps (`--first-max-new-tokens`): when a first request asks less, what a cut there
becomes, that the chain of parts ends where one request with the full cap ends, and the `auto` cap
read from a run's finished lengths (real Redis)."""
from __future__ import annotations

import itertools
from unittest.mock import patch

import pytest
from helpers.run_stats import record_completion
from hypothesis import given
from hypothesis import strategies as st
from test_generation_policies import generation
from test_generation_policies import payload as policy_payload

from genfleet.common.records import TaskPayload
from genfleet.common.settings import Settings
from genfleet.producer.run_config import CliOptions, ConfigError, DatasetSpec, parse_first_cap, resolve
from genfleet.workers.generation.first_cap import (
    MIN_FIRST_CAP,
    MIN_STAGED_REST,
    FirstCaps,
    auto_value,
    next_stage,
    staged,
)
from genfleet.workers.generation.replies import Continuation, follow_up, joined


def payload(**changes) -> TaskPayload:
    """A prompt with a 1,000-token cap whose first request may ask 100 (no `--on-truncated`)."""
    return policy_payload(**{"max_new_tokens": 1000, "on_truncated": "keep", "max_new_tokens_total": None,
                             "first_max_new_tokens": 100, **changes})


def test_a_first_request_asks_the_first_cap_and_remembers_the_full_one():
    first = staged(payload(), 100, api="generate", exact_text=True)
    assert (first.max_new_tokens, first.staged_from) == (100, 1000)


@pytest.mark.parametrize("case", ["no cap", "cap not smaller", "too little left", "chat", "no ids", "regenerate all",
                                  "no tokenizer",
                                  "continuation", "regenerated", "already staged"])
def test_staging_leaves_a_request_whole_where_it_cannot_continue_exactly(case):
    task, cap, api, exact = payload(), 100, "generate", True
    if case == "no cap":
        cap = None
    elif case == "cap not smaller":
        cap = 1000
    elif case == "too little left":
        cap = 1000 - MIN_STAGED_REST + 1
    elif case == "chat":
        api = "chat"
    elif case == "no ids":
        task = payload(input_ids=None)
    elif case == "regenerate all":
        task = payload(regenerate="all")
    elif case == "no tokenizer":
        exact = False
    elif case == "continuation":
        task = follow_up(staged(task, 100, api=api, exact_text=True), generation(list(range(100))),
                         api=api, started_at=0.0)
    elif case == "regenerated":
        task = payload(regenerated=True)
    elif case == "already staged":
        task = payload(staged_from=1000, max_new_tokens=50)
    assert staged(task, cap, api=api, exact_text=exact) is task


@pytest.mark.parametrize("on_truncated", ["keep", "continue", "regenerate"])
def test_a_cut_at_the_first_cap_goes_on_in_its_own_queue_in_doubling_stages_whatever_on_truncated_says(on_truncated):
    task = staged(payload(on_truncated=on_truncated, max_new_tokens_total=4000), 100, api="generate",
                  exact_text=True)
    asked, done = [task.max_new_tokens], 0
    while task.staged_from is not None:
        done += task.max_new_tokens
        prior = Continuation.of(task)
        part = generation(list(range(len(prior.output_ids) if prior else 0, done)))
        task = follow_up(task, part if prior is None else joined(prior, part), api="generate", started_at=5.0)
        assert task is not None and task.partition == "short"
        assert Continuation.of(task).output_ids == list(range(done))
        asked.append(task.max_new_tokens)
    # Twice the stage before, until twice would leave under MIN_STAGED_REST of the real cap: then the rest.
    assert asked == [100, 200, 400, 300]
    # The cut at the real cap is the dataset's own: --on-truncated decides it.
    whole = joined(Continuation.of(task), generation(list(range(700, 1000))))
    after = follow_up(task, whole, api="generate", started_at=6.0)
    if on_truncated == "keep":
        assert after is None
    else:
        assert after is not None and after.partition == "long"
        assert (after.max_new_tokens, after.continuation is not None) == (
            (3000, True) if on_truncated == "continue" else (4000, False))


@pytest.mark.parametrize(("asked", "left", "expected"), [
    (100, 900, 200),  # twice
    (100, 264, 200),  # twice leaves exactly MIN_STAGED_REST
    (100, 263, 263),  # twice would leave less: the rest
    (400, 300, 300),  # twice is past the real cap
])
def test_the_next_stage_doubles_until_the_rest_of_the_real_cap_is_near(asked, left, expected):
    assert next_stage(asked, left) == expected


def test_a_flagged_loop_is_never_staged_and_a_loop_found_at_the_first_cap_ends_the_completion():
    flagged = payload(loop_guard="flag")
    assert staged(flagged, 100, api="generate", exact_text=True) is flagged  # its finding is the whole's
    found = {"period": 5, "repeats": 20, "start": 0, "at_token": 100}
    # The abort on the chunk that reached the cap: the stream ended "length", the loop was found.
    cut_in_a_loop = generation(list(range(100)), loop=found)
    assert follow_up(staged(payload(), 100, api="generate", exact_text=True), cut_in_a_loop, api="generate",
                     started_at=0.0) is None
    aborted = generation(list(range(100)), finish="loop", loop=found)
    assert follow_up(staged(payload(), 100, api="generate", exact_text=True), aborted, api="generate",
                     started_at=0.0) is None


def test_a_first_request_the_server_cut_short_is_not_continued():
    first = staged(payload(), 100, api="generate", exact_text=True)
    cut = generation(list(range(40)), granted_tokens=40)
    assert follow_up(first, cut, api="generate", started_at=0.0) is None


# Small numbers, so that lengths meet caps and totals often (equal, one apart, beyond).
@given(length=st.integers(1, 60), first_cap=st.integers(1, 30), full_cap=st.integers(1, 30),
       on_truncated=st.sampled_from(["keep", "continue", "regenerate"]), extra=st.integers(0, 20))
def test_the_parts_end_where_one_request_with_the_full_cap_ends(length, first_cap, full_cap, on_truncated, extra):
    """A model that would write `length` tokens and stop: the chain of staged parts and the
    dataset's own follow-ups gives the ids, and the finish, of the same policy without staging."""
    def run(task: TaskPayload) -> tuple[list[int], str, int]:
        prior, requests = None, 0
        while True:
            requests += 1
            done = len(prior.output_ids) if prior else 0
            ids = list(range(done, min(length, done + task.max_new_tokens)))
            part = generation(ids, finish="stop" if done + len(ids) == length else "length")
            whole = part if prior is None else joined(prior, part)
            if (task := follow_up(task, whole, api="generate", started_at=0.0)) is None:
                return whole.output_ids, whole.finish, requests
            prior = Continuation.of(task)
            if task.regenerated:  # from scratch, with the larger budget
                prior = None

    base = payload(max_new_tokens=full_cap, on_truncated=on_truncated, max_new_tokens_total=full_cap + extra,
                   first_max_new_tokens=None)
    whole_ids, whole_finish, whole_requests = run(base)
    # Small numbers stage too (in a real run a first cap leaves at least MIN_STAGED_REST).
    with patch("genfleet.workers.generation.first_cap.MIN_STAGED_REST", 1):
        ids, finish, requests = run(staged(base, first_cap, api="generate", exact_text=True))
    assert (ids, finish) == (whole_ids, whole_finish)
    # One more request for each staged part's end the completion ran past: first_cap, then each
    # stage twice the one before, short of the real cap.
    ends, stage = [], first_cap
    while first_cap < full_cap and sum(ends) + stage < full_cap:
        ends.append(stage)
        stage *= 2
    reached = [end for end in itertools.accumulate(ends) if end < min(length, full_cap)]
    assert requests == whole_requests + len(reached)


def test_auto_starts_at_its_start_then_follows_the_datasets_lengths(redis_client):
    settings = Settings(first_cap_start=512, first_cap_min_samples=50, first_cap_quantile=0.9)
    caps = FirstCaps(redis_client, settings)
    task = payload(run="auto", first_max_new_tokens="auto")
    for tokens in range(1, 41):
        record_completion(redis_client, "auto", "d", "short", tokens * 10)
    assert caps.auto_cap("auto", "d", previous=512) == 512  # 40 finished: too few to judge
    for tokens in range(41, 101):
        record_completion(redis_client, "auto", "d", "short", tokens * 10)
    cap = caps.auto_cap("auto", "d", previous=512)
    assert cap % 64 == 0 and 900 <= cap <= 1024  # 100 lengths 10..1000: p90 ~ 900 (log buckets)
    assert caps.cap_for(task) == cap and caps.current() == {("auto", "d"): cap}
    # Another dataset of the run is judged on its own lengths.
    assert caps.auto_cap("auto", "other", previous=512) == 512
    assert caps.cap_for(payload(first_max_new_tokens=64)) == 64
    assert caps.cap_for(payload(first_max_new_tokens=None)) is None


def test_auto_never_goes_below_its_floor():
    assert auto_value(3.0, start=512) == MIN_FIRST_CAP
    assert auto_value(None, start=512) == 512
    assert auto_value(129.0, start=512) == 192


@pytest.mark.parametrize(("text", "value"), [("auto", "auto"), ("512", 512), (None, None)])
def test_the_flag_takes_a_count_or_auto(text, value):
    assert parse_first_cap(text) == value


@pytest.mark.parametrize("text", ["0", "-5", "big", "1.5", ""])
def test_a_bad_flag_value_is_refused_naming_the_flag(text):
    with pytest.raises(ConfigError, match="--first-max-new-tokens must be a positive number"):
        parse_first_cap(text)


def test_staged_caps_with_every_turn_regenerated_are_refused(tmp_path):
    cli = CliOptions(datasets=(DatasetSpec("d", tmp_path / "d.jsonl"),), run="r", tokenizer="t", regenerate="all",
                     first_max_new_tokens=256)
    with pytest.raises(ConfigError, match="--first-max-new-tokens works on one reply"):
        resolve(cli, None, Settings())
