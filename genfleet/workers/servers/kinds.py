"""Which kind of server each upstream is, found by asking it, and the `ServerApi` that sends each
upstream's calls to its kind: one worker can stream from SGLang and vLLM hosts at once, and the
user gives only URLs.

An upstream is vLLM if it answers `/version` with a version (vllm 0.32.0
`entrypoints/serve/instrumentator/basic.py`), else SGLang (0.5.23 `entrypoints/http_server.py` has
no `/version`; the simulator speaks SGLang's wire). `/server_info` does not tell them apart: a vLLM
started with `VLLM_SERVER_DEV_MODE=1` serves one too (`entrypoints/serve/dev/server_info/
api_router.py`), and asked first it sent such a server SGLang's `/generate`. The answer is kept
until the host comes back from an outage (`forget`: it may have been replaced); an upstream that
does not answer yet is treated as SGLang, and asked again.
"""
from __future__ import annotations

import threading
from collections.abc import Callable

import httpx

from genfleet.common.fleet_stats import SGLANG, VLLM
from genfleet.workers.generation.loop_guard import StreamWatch
from genfleet.workers.servers.api import (
    Generation,
    GenerationRequest,
    Health,
    LoadReading,
    ModelIdentity,
    ServerApi,
    ServerDescription,
)
from genfleet.workers.servers.sglang import SglangServer
from genfleet.workers.servers.vllm import VllmServer

KINDS = (SGLANG, VLLM)


def probe_kind(http: httpx.Client, upstream: str, timeout_s: float = 5.0) -> str | None:
    """"sglang", "vllm", or None when the upstream does not answer (ask again later)."""
    try:
        response = http.get(f"{upstream}/version", timeout=timeout_s)
    except httpx.HTTPError:
        return None
    try:
        version = response.json().get("version") if response.status_code == 200 else None
    except (ValueError, AttributeError):
        version = None
    return VLLM if isinstance(version, str) else SGLANG


class AnyServer:
    """`api.ServerApi` over upstreams of either kind: each call goes to its upstream's kind."""

    load_source = "load page (SGLang's /v1/loads, vLLM's /metrics)"

    def __init__(self, *, max_connections: int, connect_timeout_s: float, stall_timeout_s: float) -> None:
        self.sglang = SglangServer(max_connections=max_connections, connect_timeout_s=connect_timeout_s,
                                   stall_timeout_s=stall_timeout_s)
        self.vllm = VllmServer(max_connections=max_connections, connect_timeout_s=connect_timeout_s,
                               stall_timeout_s=stall_timeout_s)
        self._kinds: dict[str, str] = {}
        self._asking = threading.Lock()

    def kind(self, upstream: str) -> str | None:
        kind = self._kinds.get(upstream)
        if kind is None:
            with self._asking:
                kind = self._kinds.get(upstream) or probe_kind(self.sglang.http, upstream)
                if kind is not None:
                    self._kinds[upstream] = kind
        return kind

    def of(self, upstream: str) -> ServerApi:
        return self.vllm if self.kind(upstream) == VLLM else self.sglang

    def generate(self, upstream: str, request: GenerationRequest, *, deadline: float,
                 should_stop: Callable[[], bool] = lambda: False, watch: StreamWatch | None = None) -> Generation:
        return self.of(upstream).generate(upstream, request, deadline=deadline, should_stop=should_stop, watch=watch)

    def abort(self, upstream: str, request_id: str) -> None:
        self.of(upstream).abort(upstream, request_id)

    def describe(self, upstream: str) -> ServerDescription:
        return self.of(upstream).describe(upstream)

    def model_identity(self, upstream: str) -> ModelIdentity:
        return self.of(upstream).model_identity(upstream)

    def read_load(self, upstream: str) -> LoadReading:
        return self.of(upstream).read_load(upstream)

    def health(self, upstream: str, timeout_s: float) -> Health:
        # Both kinds answer GET /health; the kind is not asked here, so a host that is down costs
        # one request per probe.
        return self.sglang.health(upstream, timeout_s)

    def forget(self, upstream: str) -> None:
        self._kinds.pop(upstream, None)
        self.sglang.forget(upstream)
        self.vllm.forget(upstream)

    def interrupt_streams(self) -> None:
        self.sglang.interrupt_streams()
        self.vllm.interrupt_streams()

    def close(self) -> None:
        self.sglang.close()
        self.vllm.close()
