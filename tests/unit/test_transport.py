"""The streams' HTTP/1.1 connections (`workers/servers/transport.py`) against a raw-socket server in
this process that keeps connections alive, closes them or drops a request as a test says
(`helpers/keep_alive_server.py`)."""
from __future__ import annotations

import base64
import http.client
import ssl
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from helpers.keep_alive_server import keep_alive_server

from genfleet.workers.errors import SendFailed, TransientError, UpstreamURLError
from genfleet.workers.servers.api import GenerationRequest
from genfleet.workers.servers.transport import Origin, StreamConnections


@pytest.fixture
def connections() -> Iterator[StreamConnections]:
    pool = StreamConnections(connect_timeout_s=5, stall_timeout_s=10, tls=ssl.create_default_context())
    yield pool
    pool.close()


def stream(connections: StreamConnections, upstream: str, finished: Callable[[], bool] = lambda: False,
           ) -> list[bytes]:
    with connections.post(upstream, "/generate", {"input_ids": [1]}) as response:
        assert response.status == 200
        return list(response.blocks(finished))


def test_streams_share_kept_connections_at_most_one_per_concurrent_stream(connections):
    with keep_alive_server() as (url, seen):
        threads = [threading.Thread(target=lambda: [stream(connections, url) for _ in range(5)]) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(seen.requests) == 40 and seen.connections <= 8


def test_a_kept_connection_the_server_closed_meanwhile_is_replaced_before_use(connections):
    """A server's keep-alive timeout (uvicorn's default is 5 s) closes an idle kept connection."""
    with keep_alive_server(lambda c, n: "answer-close") as (url, seen):
        stream(connections, url)
        time.sleep(0.2)  # the server's FIN arrives
        stream(connections, url)
    assert [(c, n) for c, n, _, _ in seen.requests] == [(0, 0), (1, 0)]


def test_a_request_the_server_took_and_dropped_is_not_sent_again(connections):
    """Once the request is out the server may have taken it (a proxy that forwarded it, then dropped
    the connection): sending it again could generate it twice. The attempt fails instead."""
    with keep_alive_server(lambda c, n: "drop" if (c, n) == (0, 1) else "answer") as (url, seen):
        stream(connections, url)
        with pytest.raises(http.client.RemoteDisconnected):
            stream(connections, url)
    assert [(c, n) for c, n, _, _ in seen.requests] == [(0, 0), (0, 1)]


def test_a_body_cut_short_never_returns_its_connection_for_reuse(connections):
    """A chunked body cut at a chunk boundary leaves `HTTPResponse.isclosed()` true: only a body
    read to its end makes the connection fit for another request."""
    with keep_alive_server(lambda c, n: "cut") as (url, _seen):
        blocks = stream(connections, url, finished=lambda: True)  # the final chunk had arrived
    assert b"[DONE]" in b"".join(blocks) and not connections._idle.get(url)


def test_once_interrupted_no_stream_starts(connections):
    with keep_alive_server() as (url, seen):
        connections.interrupt()
        with pytest.raises(SendFailed):
            stream(connections, url)
    assert not seen.requests


def test_a_new_connection_dropped_without_an_answer_fails_the_attempt_once(sglang_server):
    with keep_alive_server(lambda c, n: "drop") as (url, seen):
        with pytest.raises(TransientError, match="transport error"):
            sglang_server.generate(url, GenerationRequest(max_new_tokens=16, sampling={}, input_ids=[1]),
                                   deadline=time.monotonic() + 60)
    assert len([r for r in seen.requests if r[2] == "/generate"]) == 1


def test_an_upstream_below_a_path_with_credentials_gets_both(connections):
    with keep_alive_server() as (url, seen):
        stream(connections, url.replace("http://", "http://user:p%40ss@") + "/sglang/")
    _, _, path, headers = seen.requests[0]
    assert path == "/sglang/generate"
    assert headers["authorization"] == "Basic " + base64.b64encode(b"user:p@ss").decode()


@pytest.mark.parametrize("url", ["localhost:30000", "ftp://host:30000", "http://", "http://host:port",
                                 "http://gpu1:30000/prefixé"])
def test_an_upstream_that_is_not_an_http_url_is_refused_by_name(url):
    with pytest.raises(UpstreamURLError, match="URL|http|host|ASCII"):
        Origin.parse(url)
