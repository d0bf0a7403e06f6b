"""The generate task's pure parts: what a finished record adds to its dataset's counters, the
summary Flower shows, the prompt ids of each turn, the failure class of an attempt, the request
bodies sent to SGLang and the turns `--regenerate all` generates."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from genfleet.common.records import CompletionRecord, TaskPayload, Timing, Usage
from genfleet.common.run_state import Outcome
from genfleet.common.tokenizer import render_prompts
from genfleet.workers.errors import IntegrityError, PermanentError, TransientError
from genfleet.workers.failures import verdict
from genfleet.workers.generation.replies import history_before, prompt_ids, reply_positions
from genfleet.workers.servers.api import GenerationRequest
from genfleet.workers.servers.sglang import chat_body, generate_body
from genfleet.workers.tasks import outcome_of, summary

QUESTION = [{"role": "user", "content": "hi"}]


def record(reasoning: str = "thought", content: str = "answer", finish: str = "stop",
           duration_s: float = 2.0) -> CompletionRecord:
    return CompletionRecord(
        id="d/1", run="r", dataset="d", partition="short", messages=QUESTION, reasoning=reasoning,
        content=content, finish_reason=finish, matched_stop=None,
        usage=Usage(prompt_tokens=5, completion_tokens=101, reasoning_tokens=40, cached_tokens=0),
        upstream="http://gpu-1", model="m", sampling={}, timing=Timing(0.0, 0.0, 0.1, duration_s),
        attempts=1, worker="w", row=1)


def payload(**fields: object) -> TaskPayload:
    return TaskPayload(**{"run": "r", "id": "d/1", "dataset": "d", "row": 1, "partition": "short",
                          "prompt_tokens": 5, "max_new_tokens": 64, "messages": QUESTION, **fields})


def test_a_record_adds_its_tokens_and_its_data_quality_flags_to_the_counters():
    assert outcome_of(record(), "kimi_k2", {}) == Outcome(5, 101, 40, truncated=False, empty_reasoning=False,
                                                          empty_content=False)
    cut = outcome_of(record(reasoning=" \n", content="", finish="length"), "kimi_k2", {})
    assert (cut.truncated, cut.empty_reasoning, cut.empty_content) == (True, True, True)


@pytest.mark.parametrize(("parser", "kwargs", "flagged"), [
    ("kimi_k2", {}, True),  # the template opens <think>: empty reasoning is the classic silent bug
    ("kimi_k2", {"thinking": False}, False),  # thinking turned off: no reasoning expected
    ("qwen3", {"enable_thinking": False}, False),
    ("kimi", {}, False),  # the model opens reasoning itself, if it wants to
    ("none", {}, False),
])
def test_empty_reasoning_is_flagged_only_where_the_prompt_opened_reasoning(parser, kwargs, flagged):
    assert outcome_of(record(reasoning=""), parser, kwargs).empty_reasoning is flagged


def test_the_summary_flower_shows_leads_with_throughput_and_never_divides_by_zero():
    shown = summary(record())
    assert list(shown)[0] == "tok_s" and shown["tok_s"] == 50.5
    assert shown.items() >= {"completion_tokens": 101, "reasoning_tokens": 40, "finish_reason": "stop",
                             "seconds": 2.0, "upstream": "http://gpu-1", "id": "d/1"}.items()
    assert summary(record(duration_s=0.0))["tok_s"] is None


def test_the_first_turn_uses_the_producers_ids_and_later_turns_need_the_tokenizer(tokenizer):
    runtime = SimpleNamespace(tokenizer=None)
    assert prompt_ids(payload(input_ids=[1, 2, 3]), runtime, QUESTION) == [1, 2, 3]
    with pytest.raises(PermanentError, match="GENFLEET_TOKENIZER"):
        prompt_ids(payload(regenerate="all"), runtime, QUESTION)
    runtime.tokenizer = tokenizer
    kwargs = {"thinking": False}
    assert prompt_ids(payload(regenerate="all", chat_template_kwargs=kwargs), runtime, QUESTION) == \
        render_prompts(tokenizer, [QUESTION], kwargs)[0]


def test_an_attempt_is_transient_until_its_last_then_it_takes_its_dead_letter_class():
    assert verdict(TransientError("x"), 1, 3) == "transient"
    assert verdict(TransientError("x"), 3, 3) == "exhausted"
    assert verdict(IntegrityError("x"), 3, 3) == "integrity"
    assert verdict(PermanentError("x"), 1, 3) == "permanent"


def test_request_bodies_carry_only_sglangs_own_field_names():
    sampled = payload(sampling={"temperature": 0.6, "sampling_seed": 7}, chat_template_kwargs={"thinking": True})
    request = GenerationRequest(max_new_tokens=sampled.max_new_tokens, sampling=sampled.sampling, input_ids=[1, 2],
                                chat_template_kwargs=sampled.chat_template_kwargs, skip_special_tokens=False,
                                stream_interval=8)
    body = generate_body(request)
    assert body == {"input_ids": [1, 2], "stream": True, "sampling_params": {
        "temperature": 0.6, "sampling_seed": 7, "max_new_tokens": 64, "skip_special_tokens": False,
        "stream_interval": 8}}
    text = generate_body(GenerationRequest(max_new_tokens=64, sampling={}, text="hello", skip_special_tokens=True,
                                           stream_interval=1))
    assert text["text"] == "hello" and "input_ids" not in text
    chat = chat_body(GenerationRequest(max_new_tokens=sampled.max_new_tokens, sampling=sampled.sampling,
                                       messages=QUESTION, chat_template_kwargs=sampled.chat_template_kwargs))
    assert chat == {"model": "default", "messages": QUESTION, "max_tokens": 64, "temperature": 0.6, "seed": 7,
                    "chat_template_kwargs": {"thinking": True}, "separate_reasoning": True}


def test_regenerate_all_replies_at_every_assistant_turn_after_a_user_on_the_models_own_history():
    conversation = [{"role": "system", "content": "s"}, {"role": "assistant", "content": "greeting"},
                    {"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"},
                    {"role": "user", "content": "q2"}]
    assert reply_positions(conversation, "last") == [5]
    assert reply_positions(conversation, "all") == [3, 5]  # not the greeting before any user turn
    own = {3: {"role": "assistant", "content": "my a1"}}
    assert history_before(conversation, 5, own) == [*conversation[:3], own[3], conversation[4]]
