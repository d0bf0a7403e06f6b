"""Which kind an upstream is (workers/servers/kinds.py `probe_kind`), from what each server answers:
SGLang 0.5.23 has no `/version` and serves `/server_info`; vLLM 0.32.0 serves `/version`, and
`/server_info` too when it runs with `VLLM_SERVER_DEV_MODE=1` (its dev routers)."""
from __future__ import annotations

import httpx

from genfleet.workers.servers.kinds import SGLANG, VLLM, probe_kind

SGLANG_PAGES = {"/server_info": {"version": "0.5.23", "tokenizer_path": "/m"}}
VLLM_PAGES = {"/version": {"version": "0.32.0"}}
VLLM_DEV_MODE_PAGES = {**VLLM_PAGES, "/server_info": {"vllm_config": "...", "vllm_env": {}, "system_env": {}}}


def _client(pages: dict[str, dict]) -> httpx.Client:
    def answer(request: httpx.Request) -> httpx.Response:
        page = pages.get(request.url.path)
        return httpx.Response(200, json=page) if page is not None else httpx.Response(404, json={"detail": "Not Found"})

    return httpx.Client(transport=httpx.MockTransport(answer))


def test_each_server_is_its_kind():
    assert probe_kind(_client(SGLANG_PAGES), "http://h") == SGLANG
    assert probe_kind(_client(VLLM_PAGES), "http://h") == VLLM


def test_a_vllm_in_dev_mode_is_vllm():
    """It serves `/server_info` too: asked first, that page made it SGLang, and every prompt then
    died on a 404 from `/generate` (found by the bench, which runs vLLM in dev mode for its
    `/reset_prefix_cache`)."""
    assert probe_kind(_client(VLLM_DEV_MODE_PAGES), "http://h") == VLLM


def test_an_upstream_that_does_not_answer_is_asked_again():
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    assert probe_kind(httpx.Client(transport=httpx.MockTransport(refuse)), "http://h") is None
