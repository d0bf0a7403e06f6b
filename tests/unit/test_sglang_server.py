"""The SGLang server seam (`workers/servers/sglang.py`) against a stub server in this process: a
stream that ends before its final chunk is a retryable StreamCut, never a short completion."""
from __future__ import annotations

import json
import time

import pytest
from helpers.http_stub import http_stub

from genfleet.workers.errors import StreamCut
from genfleet.workers.generation.loop_guard import LoopThresholds, StreamWatch
from genfleet.workers.servers.api import GenerationRequest

REQUEST = GenerationRequest(max_new_tokens=16, sampling={}, input_ids=[1])
CHUNK = b'data: {"text":" a","output_ids":[5],"meta_info":{"finish_reason":null,"completion_tokens":1}}\n\n'


def cut_short(request) -> None:
    request.rfile.read(int(request.headers["Content-Length"]))
    request.send_response(200)
    request.send_header("Content-Type", "text/event-stream")
    request.end_headers()
    request.wfile.write(CHUNK)  # then the connection closes: no finish, no [DONE]


def test_a_stream_that_ends_without_its_final_chunk_is_retryable(sglang_server):
    with http_stub(post=cut_short) as url:
        with pytest.raises(StreamCut) as caught:
            sglang_server.generate(url, REQUEST, deadline=time.monotonic() + 60)
    assert caught.value.retryable


def endless_loop(aborted: list[dict]):
    """A server whose completion repeats a 7-token unit forever (it never sends a finish), and which
    records the `/abort_request` bodies it gets."""
    def answer(request) -> None:
        body = json.loads(request.rfile.read(int(request.headers["Content-Length"])))
        if request.path == "/abort_request":
            aborted.append(body)
            request.send_response(200)
            request.send_header("Content-Length", "0")
            request.end_headers()
            return
        request.send_response(200)
        request.send_header("Content-Type", "text/event-stream")
        request.end_headers()
        ids = list(range(100, 130))  # 30 tokens that do not repeat, then the loop
        try:
            for _ in range(400):
                ids += [7, 8, 9, 10, 11, 12, 13]
                chunk = {"text": "", "output_ids": ids, "meta_info": {"finish_reason": None,
                                                                       "completion_tokens": len(ids)}}
                request.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                request.wfile.flush()
        except OSError:
            pass  # the client hung up: what the loop guard does
    return answer


@pytest.mark.parametrize("policy", ["abort", "flag"])
def test_the_loop_guard_cuts_the_stream_and_asks_the_server_to_drop_the_request(sglang_server, policy):
    aborted: list[dict] = []
    watch = StreamWatch(policy, LoopThresholds())
    with http_stub(post=endless_loop(aborted)) as url:
        if policy == "flag":  # a stream that never finishes is cut short, whatever was flagged
            with pytest.raises(StreamCut):
                sglang_server.generate(url, REQUEST, deadline=time.monotonic() + 60, watch=watch)
            assert watch.loop is not None and not aborted
            return
        generation = sglang_server.generate(url, REQUEST, deadline=time.monotonic() + 60, watch=watch)
    assert generation.finish == "loop" and generation.loop == watch.loop.to_dict()
    assert generation.loop["period"] == 7 and generation.loop["start"] == 30
    assert generation.loop["at_token"] - 30 <= LoopThresholds().latest(7)
    assert len(generation.output_ids) == generation.completion_tokens < 30 + 7 * 400
    assert aborted == [{"rid": generation.request_id}]


def unicode_line_separators(request) -> None:
    """SGLang 0.5.23 writes each chunk with orjson (`utils/json_response.py` `dumps_json`), which
    leaves U+2028, U+2029 and U+0085 raw in the UTF-8: a model's text may hold them."""
    request.rfile.read(int(request.headers["Content-Length"]))
    request.send_response(200)
    request.send_header("Content-Type", "text/event-stream")
    request.end_headers()
    for ids, text, finish in (([5], "a\u2028b", None), ([5, 6], "a\u2028b\x85c\u2029", {"type": "stop"})):
        chunk = {"text": text, "output_ids": ids, "meta_info": {"finish_reason": finish, "completion_tokens": len(ids)}}
        request.wfile.write(b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + b"\n\n")
    request.wfile.write(b"data: [DONE]\n\n")


def test_text_holding_unicode_line_separators_arrives_whole(sglang_server):
    """httpx's `iter_lines` splits lines as `str.splitlines` does, at U+2028, U+2029 and U+0085 too:
    such a chunk was cut in two, failed to parse and was retried until dead-lettered."""
    with http_stub(post=unicode_line_separators) as url:
        generation = sglang_server.generate(url, REQUEST, deadline=time.monotonic() + 60)
    assert generation.text == "a\u2028b\x85c\u2029" and generation.output_ids == [5, 6]


def finished_then_reset(request) -> None:
    """The final chunk and [DONE] arrive, then the connection drops before the chunked body's end."""
    request.rfile.read(int(request.headers["Content-Length"]))
    request.send_response(200)
    request.send_header("Content-Type", "text/event-stream")
    request.send_header("Transfer-Encoding", "chunked")
    request.end_headers()
    final = {"text": " a", "output_ids": [5], "meta_info": {"finish_reason": {"type": "stop"}, "completion_tokens": 1}}
    for event in (b"data: " + json.dumps(final).encode() + b"\n\n", b"data: [DONE]\n\n"):
        request.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
    request.wfile.flush()
    request.close_connection = True  # no terminating 0-size chunk: the body is cut


def test_a_connection_lost_after_the_final_chunk_keeps_the_generation(sglang_server):
    """Reading on past [DONE] (for the connection's reuse) must not turn a finished stream into a
    failed attempt when only the body's end is missing."""
    with http_stub(post=finished_then_reset) as url:
        generation = sglang_server.generate(url, REQUEST, deadline=time.monotonic() + 60)
    assert generation.finish == "stop" and generation.matched_stop is None and generation.output_ids == [5]
