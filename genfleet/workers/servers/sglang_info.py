"""What an SGLang server says about itself: its settings (`/server_info`), its model (`/model_info`)
and its load (`/v1/loads`), read into the seam's terms (`api.py`).

SGLang 0.5.23 `utils/common.py::build_server_info` returns `server_args.resolved_dict()` flat, so
`incremental_streaming_output`, `stream_interval`, `reasoning_parser`, `context_length` and
`revision` are top-level keys of `/server_info`; `context_length` is None unless the server was
started with it, and then `/v1/models` says `max_model_len`. `/get_server_info` is the older name,
still an alias in 0.5.23 (`entrypoints/http_server.py`).

The model (`entrypoints/http_server.py`):
- `name`: `/model_info` `served_model_name`, else `model_path`;
- `revision`: `/server_info` `revision`, the `--revision` (branch, tag or commit) the server was
  launched with: null by default (`arg_groups/fields/model.py`), and after a weight update still the
  launch's (`/server_info` reports the startup configuration);
- `weight_version`: `/model_info` `weight_version`, "default" unless `--weight-version` or a weight
  update set it (`arg_groups/fields/serving.py`; the value in effect, `TokenizerManager.config_value`).

The stream mode and the model are asked once per upstream and cached (`ServerInfo`), forgotten when
the host's breaker closes again: a host that comes back may have restarted with other settings, or
another model. A weight update on a live server (`/update_weight_version`, or
`/update_weights_from_disk` with a `weight_version`) is seen only after the host is forgotten.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any

import httpx

from genfleet.common.fleet_stats import SGLANG, ServerLoad
from genfleet.workers.servers.api import (
    UNKNOWN_MODEL,
    LoadProblem,
    LoadReading,
    ModelIdentity,
    ServerDescription,
)

LOADS_PATH = "/v1/loads"


@dataclass(frozen=True)
class StreamMode:
    """What a server said about its streaming (`/server_info`); `incremental=None`: it did not say."""

    incremental: bool | None = None
    stream_interval: int | None = None

    @classmethod
    def from_server_info(cls, info: Any) -> StreamMode:
        if not isinstance(info, dict):
            return cls()
        incremental = info.get("incremental_streaming_output")
        interval = info.get("stream_interval")
        return cls(incremental if isinstance(incremental, bool) else None,
                   interval if _is_int(interval) else None)


UNKNOWN = StreamMode()


def identity_from_model_info(info: Any) -> ModelIdentity:
    """The name and weight version of a `/model_info` answer (its revision is `/server_info`'s)."""
    if not isinstance(info, dict):
        return UNKNOWN_MODEL
    name = str(info.get("served_model_name") or info.get("model_path") or "unknown")
    return ModelIdentity(name, weight_version=_reported(info.get("weight_version")))


def revision_from_server_info(info: Any) -> str | None:
    """`revision` of a `/server_info` answer."""
    return _reported(info.get("revision")) if isinstance(info, dict) else None


def load_from_loads(body: Any) -> ServerLoad:
    """One `/v1/loads` answer (0.5.23 `entrypoints/v1_loads.py`, built by
    `managers/scheduler_components/load_inquirer.py::get_loads`), summed over its data-parallel
    ranks; raises ValueError, KeyError or TypeError for an answer that is not a load."""
    loads = body["loads"]
    if not isinstance(loads, list) or not loads or not all(isinstance(load, dict) for load in loads):
        raise ValueError("no loads in the answer")
    usage = [float(load.get("token_usage") or 0.0) for load in loads]
    capacity = [load.get("max_total_num_tokens") for load in loads]
    running_caps = [load.get("max_running_requests") for load in loads]
    return ServerLoad(
        running=sum(int(load["num_running_reqs"]) for load in loads),
        waiting=sum(int(load["num_waiting_reqs"]) for load in loads),
        token_usage=max(usage),
        retracted=sum(int((load.get("queues") or {}).get("retracted") or 0) for load in loads),
        gen_throughput=sum(float(load.get("gen_throughput") or 0.0) for load in loads),
        max_total_tokens=sum(capacity) if all(isinstance(c, int) for c in capacity) else None,
        max_running=sum(running_caps) if all(_is_int(c) and c > 0 for c in running_caps) else None,
        server=SGLANG,
    )


class ServerInfo:
    """The pages an SGLang server describes itself with, asked through `http` (the worker's client
    for short requests); the stream mode, revision and model cached per upstream."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http
        self._models: dict[str, ModelIdentity] = {}  # from /model_info, without the revision
        self._stream_modes: dict[str, StreamMode] = {}
        self._revisions: dict[str, str | None] = {}  # from the same /server_info answer as the mode
        self._asking = threading.Lock()  # 150 threads starting at once ask /server_info once

    def forget(self, upstream: str) -> None:
        self._models.pop(upstream, None)
        self._stream_modes.pop(upstream, None)
        self._revisions.pop(upstream, None)

    def stream_mode(self, upstream: str) -> StreamMode:
        """Cumulative or incremental chunks, as the server's `/server_info` says, asked once per
        upstream; UNKNOWN (infer from the chunks) where neither it nor `/get_server_info` answers."""
        mode = self._stream_modes.get(upstream)
        if mode is not None:
            return mode
        with self._asking:
            mode = self._stream_modes.get(upstream)
            if mode is None:
                info = self.ask_server_info(upstream)
                if info is not None:
                    mode = StreamMode.from_server_info(info)
                    self._revisions[upstream] = revision_from_server_info(info)
                    self._stream_modes[upstream] = mode
        return mode or UNKNOWN

    def model_identity(self, upstream: str) -> ModelIdentity:
        """Name, revision and weight version, from the answers already cached: `/server_info` is
        asked here only where no stream asked it yet (the chat API does not need its stream mode)."""
        self.stream_mode(upstream)
        return replace(self._model(upstream), revision=self._revisions.get(upstream))

    def _model(self, upstream: str) -> ModelIdentity:
        model = self._models.get(upstream)
        if model is None:
            try:
                info = self.http.get(f"{upstream}/model_info", timeout=5.0).json()
            except (httpx.HTTPError, ValueError):
                return UNKNOWN_MODEL  # not cached: asked again with the next record
            model = self._models[upstream] = identity_from_model_info(info)
        return model

    def ask_server_info(self, upstream: str) -> dict[str, Any] | None:
        """The answer; None: could not ask now (asked again next time); {}: the server has no such
        page (the stream mode is then UNKNOWN, and the revision not reported)."""
        for path in ("/server_info", "/get_server_info"):
            try:
                response = self.http.get(f"{upstream}{path}", timeout=10.0)
            except httpx.HTTPError:
                return None
            if response.status_code in (404, 405):
                continue
            if response.status_code != 200:
                return None
            try:
                info = response.json()
            except ValueError:
                continue
            return info if isinstance(info, dict) else {}
        return {}

    def describe(self, upstream: str, timeout_s: float) -> ServerDescription:
        """Everything the server says about itself, asked now."""
        info = self.ask_server_info(upstream) or {}
        mode = StreamMode.from_server_info(info)
        parser = info.get("reasoning_parser")
        return ServerDescription(
            model=replace(self._model(upstream), revision=revision_from_server_info(info)),
            reasoning_parser=parser if isinstance(parser, str) else None,
            incremental=mode.incremental, stream_interval=mode.stream_interval,
            context_length=self._context_length(upstream, info, timeout_s),
            kind=SGLANG, version=_reported(info.get("version")), load_source=LOADS_PATH,
        )

    def _context_length(self, upstream: str, info: dict[str, Any], timeout_s: float) -> int | None:
        if _is_int(info.get("context_length")):
            return int(info["context_length"])
        try:
            cards = self.http.get(f"{upstream}/v1/models", timeout=timeout_s).json()["data"]
            return int(cards[0]["max_model_len"])
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
            return None

    def read_load(self, upstream: str, timeout_s: float) -> LoadReading:
        try:
            response = self.http.get(f"{upstream}{LOADS_PATH}", timeout=timeout_s)
        except httpx.HTTPError as error:
            return LoadReading(None, LoadProblem.UNANSWERED, str(error) or type(error).__name__)
        if response.status_code in (404, 405):
            return LoadReading(None, LoadProblem.ABSENT,
                               f"it has no {LOADS_PATH} (an older SGLang, or a router in front)")
        try:
            response.raise_for_status()
            return LoadReading(load_from_loads(response.json()))
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as error:
            return LoadReading(None, LoadProblem.UNREADABLE, f"{LOADS_PATH} unreadable: {error}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _reported(value: Any) -> str | None:
    """A value as the server reported it; None where it is missing or not a string."""
    return value if isinstance(value, str) else None
