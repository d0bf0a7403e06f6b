"""Each SGLang upstream as it describes itself: healthy (`GET /health`), the model it serves
(`/model_info`, read by the workers' own `ServerInfo`), and from `/server_info` (`/get_server_info`
on older servers) its reasoning parser, stream mode, `stream_interval` and context length.

SGLang 0.5.23 `entrypoints/http_server.py::server_info` returns `server_args.resolved_dict()` flat
(`utils/common.py::build_server_info`), so `reasoning_parser`, `incremental_streaming_output`,
`stream_interval` and `context_length` are top-level keys; `context_length` is None unless the
server was started with it, and then `/v1/models` says `max_model_len`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from genfleet.common.settings import Settings
from genfleet.doctor.checks import Check, Status, fail, ok
from genfleet.workers.generation.client import SglangClient, StreamMode

HEALTH_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Upstream:
    url: str
    model: str
    info: dict[str, Any] | None  # /server_info; None where the server has none
    context_length: int | None


def upstream_check(client: SglangClient, url: str, settings: Settings,
                   run_context_length: int | None) -> tuple[Upstream | None, Check]:
    """The upstream (None when it is not healthy) and its row."""
    name = f"upstream {url}"
    try:
        health = client.http.get(f"{url}/health", timeout=HEALTH_TIMEOUT_S)
    except httpx.HTTPError as error:
        return None, fail(name, f"unreachable: {error or type(error).__name__}",
                          "start the SGLang server there, or fix --upstream")
    if health.status_code != 200:
        return None, fail(name, f"GET /health answered {health.status_code}",
                          "wait for the server to finish loading, or restart it")
    # The workers' own reader (`/server_info`, else the older `/get_server_info`); {} or None: not said.
    info = client.servers.ask_server_info(url) or None
    upstream = Upstream(url, client.model_name(url), info, _context_length(client.http, url, info))
    return upstream, _judge(name, upstream, settings, run_context_length)


def _judge(name: str, upstream: Upstream, settings: Settings, run_context_length: int | None) -> Check:
    info = upstream.info or {}
    mode = StreamMode.from_server_info(info)
    stream = ("not reported" if mode.incremental is None else
              "incremental" if mode.incremental else "cumulative")
    server_parser = info.get("reasoning_parser")
    context = f"{upstream.context_length:,}" if upstream.context_length else "unknown"
    detail = (f"healthy; model {upstream.model}; reasoning parser {server_parser or 'none'}; stream {stream}, "
              f"stream_interval {mode.stream_interval or '?'} (requests ask {settings.stream_interval}); "
              f"context {context}")
    findings: list[tuple[Status, str, str]] = []
    if run_context_length and upstream.context_length and run_context_length > upstream.context_length:
        findings.append((Status.FAIL, f"the run's context_length {run_context_length:,} is above the server's",
                         "lower context_length in the run file (or --context-length) to the server's"))
    if server_parser and server_parser != settings.reasoning_parser:
        # Over /v1/chat/completions the server splits, so its parser is the one that counts.
        status = Status.FAIL if settings.api == "chat" else Status.WARN
        findings.append((status, f"the server's reasoning parser is {server_parser}, genfleet splits with "
                                 f"{settings.reasoning_parser}",
                         f"GENFLEET_REASONING_PARSER={server_parser} if that is the model's parser"))
    if mode.incremental is None:
        findings.append((Status.WARN, "no stream mode in /server_info: workers infer it from the chunks",
                         "run a server that answers /server_info (SGLang 0.5.23 does)"))
    if not findings:
        return ok(name, detail)
    status = Status.FAIL if any(s is Status.FAIL for s, _, _ in findings) else Status.WARN
    worst = [f for f in findings if f[0] is status]
    return Check(name, status, "; ".join([detail, *(text for _, text, _ in worst)]), worst[0][2])


def _context_length(http: httpx.Client, url: str, info: dict[str, Any] | None) -> int | None:
    if info and isinstance(info.get("context_length"), int):
        return info["context_length"]
    try:
        cards = http.get(f"{url}/v1/models", timeout=HEALTH_TIMEOUT_S).json()["data"]
        return int(cards[0]["max_model_len"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return None
