"""Streams to an https:// upstream: the certificate is verified against the CAs the worker trusts
(`SSL_CERT_FILE`, as httpx reads it for the worker's short requests), and the connection is kept."""
from __future__ import annotations

import ssl
import time
from collections.abc import Callable, Iterator

import pytest
from helpers.certificates import make_certificates
from helpers.keep_alive_server import keep_alive_server

from genfleet.workers.errors import TransientError
from genfleet.workers.servers.api import GenerationRequest
from genfleet.workers.servers.sglang import SglangServer

REQUEST = GenerationRequest(max_new_tokens=16, sampling={}, input_ids=[1])


@pytest.fixture
def certs(tmp_path):
    return make_certificates(tmp_path)


@pytest.fixture
def server_tls(certs) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs["cert"], certs["key"])
    return context


@pytest.fixture
def sglang_trusting(monkeypatch) -> Iterator[Callable[[object], SglangServer]]:
    """A worker's SGLang server seam that trusts only the CA given (made after SSL_CERT_FILE is set)."""
    made: list[SglangServer] = []

    def make(ca: object) -> SglangServer:
        monkeypatch.setenv("SSL_CERT_FILE", str(ca))
        made.append(SglangServer(max_connections=4, connect_timeout_s=5, stall_timeout_s=10))
        return made[-1]

    yield make
    for server in made:
        server.close()


def test_a_stream_over_tls_is_verified_and_its_connection_kept(certs, server_tls, sglang_trusting):
    sglang = sglang_trusting(certs["ca"])
    with keep_alive_server(tls=server_tls) as (url, seen):
        for _ in range(3):
            generation = sglang.generate(url, REQUEST, deadline=time.monotonic() + 30)
            assert generation.output_ids == [5] and (generation.finish, generation.matched_stop) == ("stop", None)
    streams = [(c, n) for c, n, path, _ in seen.requests if path == "/generate"]
    assert len({c for c, _ in streams}) == 1 and [n for _, n in streams] == [0, 1, 2]


def test_a_certificate_from_an_untrusted_ca_fails_the_attempt(certs, server_tls, sglang_trusting):
    sglang = sglang_trusting(certs["other_ca"])
    with keep_alive_server(tls=server_tls) as (url, seen):
        with pytest.raises(TransientError, match="CERTIFICATE_VERIFY_FAILED"):
            sglang.generate(url, REQUEST, deadline=time.monotonic() + 30)
    assert not [r for r in seen.requests if r[2] == "/generate"]
