"""The workers' SGLang server seam (`workers/servers/sglang.py`) against the simulator over HTTP: every
stream shape, every reasoning format, every error shape, reasoning and content recovered byte for byte."""
from __future__ import annotations

import time

import pytest
from helpers.sim_plans import FORMATS
from helpers.task_harness import sim_on_a_socket
from helpers.waits import wait_until

from genfleet.common.tokenizer import render_prompts
from genfleet.sim.completion import LengthModel, plan_completion
from genfleet.workers.errors import PermanentError, StreamStalled, TransientError, UpstreamAborted
from genfleet.workers.generation.completion_text import CompletionSplitter
from genfleet.workers.servers.api import GenerationRequest
from genfleet.workers.servers.sglang import SglangServer

SCALE = 0.03
FAST = ("--rate", "2000", "--length-scale", str(SCALE))
CONVERSATIONS = [[{"role": "user", "content": f"question number {i} about the module"}] for i in range(3)]


def generate_request(ids, *, skip_special_tokens, max_new_tokens=512, interval=4, sampling=None):
    return GenerationRequest(max_new_tokens=max_new_tokens, sampling=sampling or {}, input_ids=ids,
                             skip_special_tokens=skip_special_tokens, stream_interval=interval)


def later():
    return time.monotonic() + 60


@pytest.mark.parametrize("mode", ["cumulative", "incremental"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_reasoning_and_content_match_the_model_for_every_format_and_stream_mode(fmt, mode, tokenizer, vocab,
                                                                                sglang_server):
    flags = (*FAST, "--reasoning-format", fmt) + (("--incremental",) if mode == "incremental" else ())
    with_ids = CompletionSplitter(fmt, tokenizer)
    with_ids_skipped = CompletionSplitter(fmt, tokenizer, skip_special_tokens=True)
    text_only = CompletionSplitter(fmt)
    with sim_on_a_socket(*flags) as sim:
        for ids in render_prompts(tokenizer, CONVERSATIONS):
            plan = plan_completion(ids, seed=0, max_new_tokens=512, lengths=LengthModel(scale=SCALE), vocab=vocab,
                                   reasoning_format=fmt)
            expected = (plan.reasoning_text, plan.content_text)
            raw = sglang_server.generate(sim.url, generate_request(ids, skip_special_tokens=False), deadline=later())
            assert raw.output_ids == plan.output_ids
            split = text_only.split(raw, None)
            assert (split.reasoning, split.content) == expected
            split = with_ids.split(raw, None)
            assert (split.reasoning, split.content) == expected
            # With special tokens skipped the text loses the markers; the ids still split exactly.
            skipped = sglang_server.generate(sim.url, generate_request(ids, skip_special_tokens=True),
                                             deadline=later())
            split = with_ids_skipped.split(skipped, None)
            assert (split.reasoning, split.content) == expected


@pytest.mark.parametrize("thinking", [True, False])
def test_chat_completions_stream_carries_server_split_reasoning_and_usage(thinking, tokenizer, vocab, sglang_server):
    kwargs = {"thinking": thinking}
    with sim_on_a_socket(*FAST) as sim:
        for conversation in CONVERSATIONS:
            (ids,) = render_prompts(tokenizer, [conversation], kwargs)
            plan = plan_completion(ids, seed=0, max_new_tokens=512, lengths=LengthModel(scale=SCALE), vocab=vocab)
            request = GenerationRequest(max_new_tokens=512, sampling={}, messages=conversation,
                                        chat_template_kwargs=kwargs)
            generation = sglang_server.generate(sim.url, request, deadline=later())
            assert (generation.reasoning, generation.content) == (plan.reasoning_text, plan.content_text)
            assert generation.completion_tokens == plan.completion_tokens
            assert generation.prompt_tokens == len(ids)
            assert generation.reasoning_tokens == plan.reasoning_tokens
            assert generation.finish == plan.finish_reason["type"]
            assert (generation.reasoning == "") is (not thinking)


@pytest.mark.parametrize("flags, expected", [
    (("--http-500-rate", "1"), TransientError),
    (("--abort-rate", "1"), UpstreamAborted),
    (("--error-chunk-rate", "1"), TransientError),
    (("--error-chunk-rate", "1", "--error-format", "0.5.2"), TransientError),
    (("--context-length", "8"), PermanentError),
])
@pytest.mark.parametrize("api", ["generate", "chat"])
def test_each_failure_shape_maps_to_an_error_that_says_whether_to_retry(flags, expected, api, tokenizer, sglang_server):
    (ids,) = render_prompts(tokenizer, CONVERSATIONS[:1])
    with sim_on_a_socket(*FAST, *flags) as sim:
        with pytest.raises(expected) as caught:
            if api == "chat":
                request = GenerationRequest(max_new_tokens=64, sampling={}, messages=CONVERSATIONS[0])
                sglang_server.generate(sim.url, request, deadline=later())
            else:
                sglang_server.generate(sim.url, generate_request(ids, skip_special_tokens=False), deadline=later())
    assert caught.value.retryable is (expected is not PermanentError)


def test_an_http_400_names_the_servers_reason(sglang_server, tokenizer):
    with sim_on_a_socket(*FAST) as sim:
        request = generate_request([1, 2, 3], skip_special_tokens=False, sampling={"no_such_param": 1})
        with pytest.raises(PermanentError, match="no_such_param"):
            sglang_server.generate(sim.url, request, deadline=later())


def test_a_stalled_stream_is_abandoned_within_the_stall_timeout(tokenizer):
    (ids,) = render_prompts(tokenizer, CONVERSATIONS[:1])
    stalling = SglangServer(max_connections=4, connect_timeout_s=5, stall_timeout_s=1.0)
    with sim_on_a_socket("--rate", "50", "--length-median", "200", "--length-mean", "201", "--stall-rate", "1") as sim:
        started = time.monotonic()
        with pytest.raises(StreamStalled):
            stalling.generate(sim.url, generate_request(ids, skip_special_tokens=False, interval=1),
                              deadline=later())
        assert time.monotonic() - started < 8
        stalling.close()
        wait_until(lambda: sim.stats()["running"] == 0, timeout=10, interval=0.05,
                   message="the abandoned request still holds its slot")
