"""The SGLang client against the simulator over HTTP: every stream shape, every reasoning format,
every error shape, reasoning and content recovered byte for byte."""
from __future__ import annotations

import http.server
import threading
import time

import pytest

from common.tokenizer import load_tokenizer, render_prompts
from fleet import TOKENIZER
from sim.completion import LengthModel, plan_completion
from sim.vocab import SimVocab
from sim_process import SimProcess
from workers.sglang.split import CompletionSplitter
from workers.errors import PermanentError, StreamCut, StreamStalled, TransientError, UpstreamAborted
from workers.sglang.client import SglangClient

FORMATS = ["kimi_k2", "deepseek-r1", "qwen3", "qwen3-thinking", "glm45", "kimi", "gpt-oss", "none"]
SCALE = 0.03
FAST = ("--rate", "2000", "--length-scale", str(SCALE))
CONVERSATIONS = [[{"role": "user", "content": f"question number {i} about the module"}] for i in range(3)]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(TOKENIZER)


@pytest.fixture(scope="module")
def vocab():
    return SimVocab.from_tokenizer_dir(TOKENIZER)


@pytest.fixture
def client():
    client = SglangClient(max_connections=16, connect_timeout_s=5, stall_timeout_s=30)
    yield client
    client.close()


def generate_body(ids, *, skip_special_tokens, max_new_tokens=512, interval=4):
    return {"input_ids": ids, "stream": True,
            "sampling_params": {"max_new_tokens": max_new_tokens, "skip_special_tokens": skip_special_tokens,
                                "stream_interval": interval}}


def later():
    return time.monotonic() + 60


@pytest.mark.parametrize("mode", ["cumulative", "incremental"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_reasoning_and_content_match_the_model_for_every_format_and_stream_mode(fmt, mode, tokenizer, vocab,
                                                                                client):
    flags = (*FAST, "--reasoning-format", fmt) + (("--incremental",) if mode == "incremental" else ())
    with_ids = CompletionSplitter(fmt, tokenizer)
    with_ids_skipped = CompletionSplitter(fmt, tokenizer, skip_special_tokens=True)
    text_only = CompletionSplitter(fmt)
    with SimProcess(*flags) as sim:
        for ids in render_prompts(tokenizer, CONVERSATIONS):
            plan = plan_completion(ids, seed=0, max_new_tokens=512, lengths=LengthModel(scale=SCALE), vocab=vocab,
                                   reasoning_format=fmt)
            expected = (plan.reasoning_text, plan.content_text)
            raw = client.generate(sim.url, generate_body(ids, skip_special_tokens=False), deadline=later())
            assert raw.output_ids == plan.output_ids
            split = text_only.split(raw, None)
            assert (split.reasoning, split.content) == expected
            split = with_ids.split(raw, None)
            assert (split.reasoning, split.content) == expected
            # With special tokens skipped the text loses the markers; the ids still split exactly.
            skipped = client.generate(sim.url, generate_body(ids, skip_special_tokens=True), deadline=later())
            split = with_ids_skipped.split(skipped, None)
            assert (split.reasoning, split.content) == expected


@pytest.mark.parametrize("thinking", [True, False])
def test_chat_completions_stream_carries_server_split_reasoning_and_usage(thinking, tokenizer, vocab, client):
    kwargs = {"thinking": thinking}
    with SimProcess(*FAST) as sim:
        for conversation in CONVERSATIONS:
            (ids,) = render_prompts(tokenizer, [conversation], kwargs)
            plan = plan_completion(ids, seed=0, max_new_tokens=512, lengths=LengthModel(scale=SCALE), vocab=vocab)
            body = {"model": "default", "messages": conversation, "max_tokens": 512, "chat_template_kwargs": kwargs}
            generation = client.chat(sim.url, body, deadline=later())
            assert (generation.reasoning, generation.content) == (plan.reasoning_text, plan.content_text)
            assert generation.completion_tokens == plan.completion_tokens
            assert generation.prompt_tokens == len(ids)
            assert generation.reasoning_tokens == plan.reasoning_tokens
            assert generation.finish_reason["type"] == plan.finish_reason["type"]
            assert (generation.reasoning == "") is (not thinking)


@pytest.mark.parametrize("flags, expected", [
    (("--http-500-rate", "1"), TransientError),
    (("--abort-rate", "1"), UpstreamAborted),
    (("--error-chunk-rate", "1"), TransientError),
    (("--error-chunk-rate", "1", "--error-format", "0.5.2"), TransientError),
    (("--context-length", "8"), PermanentError),
])
@pytest.mark.parametrize("api", ["generate", "chat"])
def test_each_failure_shape_maps_to_an_error_that_says_whether_to_retry(flags, expected, api, tokenizer, client):
    (ids,) = render_prompts(tokenizer, CONVERSATIONS[:1])
    with SimProcess(*FAST, *flags) as sim:
        with pytest.raises(expected) as caught:
            if api == "chat":
                client.chat(sim.url, {"model": "m", "messages": CONVERSATIONS[0], "max_tokens": 64}, deadline=later())
            else:
                client.generate(sim.url, generate_body(ids, skip_special_tokens=False), deadline=later())
    assert caught.value.retryable is (expected is not PermanentError)


def test_an_http_400_names_the_servers_reason(client, tokenizer):
    with SimProcess(*FAST) as sim:
        body = generate_body([1, 2, 3], skip_special_tokens=False)
        body["sampling_params"]["no_such_param"] = 1
        with pytest.raises(PermanentError, match="no_such_param"):
            client.generate(sim.url, body, deadline=later())


def test_a_stalled_stream_is_abandoned_within_the_stall_timeout(tokenizer):
    (ids,) = render_prompts(tokenizer, CONVERSATIONS[:1])
    stalling = SglangClient(max_connections=4, connect_timeout_s=5, stall_timeout_s=1.0)
    with SimProcess("--rate", "50", "--length-median", "200", "--length-mean", "201", "--stall-rate", "1") as sim:
        started = time.monotonic()
        with pytest.raises(StreamStalled):
            stalling.generate(sim.url, generate_body(ids, skip_special_tokens=False, interval=1), deadline=later())
        assert time.monotonic() - started < 8
        stalling.close()
        assert wait_for(lambda: sim.stats()["running"] == 0), "the abandoned request still holds its slot"


def test_a_stream_that_ends_without_its_final_chunk_is_retryable(client):
    chunk = b'data: {"text":" a","output_ids":[5],"meta_info":{"finish_reason":null,"completion_tokens":1}}\n\n'

    class CutShort(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's naming
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.write(chunk)  # then the connection closes: no finish, no [DONE]

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), CutShort)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(StreamCut) as caught:
            client.generate(f"http://127.0.0.1:{server.server_port}", {"input_ids": [1]}, deadline=later())
        assert caught.value.retryable
    finally:
        server.shutdown()


def wait_for(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False
