"""The worker's HTTP connections to SGLang: a finished stream's connection carries the next
request. Seen from the kernel's own table of TCP sockets (/proc/net/tcp), not from the client."""
from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from genfleet.workers.servers.api import GenerationRequest
from genfleet.workers.servers.sglang import SglangServer

TCP_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
TIME_WAIT, ESTABLISHED = "06", "01"


def sockets_to(port: int) -> list[str]:
    """The states of this machine's TCP sockets whose remote end is `port` (one side of each
    connection to the server; a connection the client closed waits in TIME_WAIT)."""
    states = []
    for table in TCP_TABLES:
        if not table.exists():
            continue
        for line in table.read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[2].rsplit(":", 1)[1], 16) == port:
                states.append(fields[3])
    return states


@pytest.mark.skipif(not TCP_TABLES[0].exists(), reason="needs Linux's /proc/net/tcp")
def test_one_thread_streams_every_generation_over_one_connection(sim, prompt):
    server = SglangServer(max_connections=4, connect_timeout_s=5, stall_timeout_s=30)
    port = urlsplit(sim.url).port
    before = sockets_to(port).count(TIME_WAIT)
    request = GenerationRequest(max_new_tokens=64, sampling={}, input_ids=prompt, skip_special_tokens=False,
                                stream_interval=8)
    try:
        for _ in range(5):
            generation = server.generate(sim.url, request, deadline=time.monotonic() + 30)
            assert generation.finish in ("stop", "length")
        states = sockets_to(port)
        # Breaking out at `data: [DONE]` left the body's last bytes unread: httpcore then closes the
        # connection instead of pooling it, and each of the five opened its own.
        assert states.count(TIME_WAIT) - before == 0, states
        assert states.count(ESTABLISHED) == 2  # the client's end and the server's
    finally:
        server.close()
