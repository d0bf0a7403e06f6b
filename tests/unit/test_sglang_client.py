"""The SGLang client against a stub server in this process: a stream that ends before its final
chunk is a retryable StreamCut, never a short completion."""
from __future__ import annotations

import time

import pytest
from helpers.http_stub import http_stub

from workers.errors import StreamCut

CHUNK = b'data: {"text":" a","output_ids":[5],"meta_info":{"finish_reason":null,"completion_tokens":1}}\n\n'


def cut_short(request) -> None:
    request.rfile.read(int(request.headers["Content-Length"]))
    request.send_response(200)
    request.send_header("Content-Type", "text/event-stream")
    request.end_headers()
    request.wfile.write(CHUNK)  # then the connection closes: no finish, no [DONE]


def test_a_stream_that_ends_without_its_final_chunk_is_retryable(sglang_client):
    with http_stub(post=cut_short) as url:
        with pytest.raises(StreamCut) as caught:
            sglang_client.generate(url, {"input_ids": [1]}, deadline=time.monotonic() + 60)
    assert caught.value.retryable
