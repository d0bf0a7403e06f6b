"""Streams to an https:// upstream: the certificate is verified against the CAs the worker trusts
(`SSL_CERT_FILE`, as httpx reads it for the worker's short requests), and the connection is kept."""
from __future__ import annotations

import ssl
import time

import pytest
from helpers.certificates import make_certificates
from helpers.keep_alive_server import keep_alive_server

from workers.errors import TransientError
from workers.sglang.client import SglangClient


@pytest.fixture
def server_tls(tmp_path):
    certs = make_certificates(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs["cert"], certs["key"])
    return certs, context


def client() -> SglangClient:
    return SglangClient(max_connections=4, connect_timeout_s=5, stall_timeout_s=10)


def test_a_stream_over_tls_is_verified_and_its_connection_kept(server_tls, monkeypatch):
    certs, context = server_tls
    monkeypatch.setenv("SSL_CERT_FILE", str(certs["ca"]))
    sglang = client()
    try:
        with keep_alive_server(tls=context) as (url, seen):
            for _ in range(3):
                generation = sglang.generate(url, {"input_ids": [1]}, deadline=time.monotonic() + 30)
                assert generation.output_ids == [5] and generation.finish_reason == {"type": "stop"}
    finally:
        sglang.close()
    streams = [(c, n) for c, n, path, _ in seen.requests if path == "/generate"]
    assert len({c for c, _ in streams}) == 1 and [n for _, n in streams] == [0, 1, 2]


def test_a_certificate_from_an_untrusted_ca_fails_the_attempt(server_tls, monkeypatch):
    certs, context = server_tls
    monkeypatch.setenv("SSL_CERT_FILE", str(certs["other_ca"]))
    sglang = client()
    try:
        with keep_alive_server(tls=context) as (url, seen):
            with pytest.raises(TransientError, match="CERTIFICATE_VERIFY_FAILED"):
                sglang.generate(url, {"input_ids": [1]}, deadline=time.monotonic() + 30)
    finally:
        sglang.close()
    assert not [r for r in seen.requests if r[2] == "/generate"]
