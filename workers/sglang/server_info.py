"""What each upstream says about itself, asked once and cached: its stream mode and the revision it
was launched with (`/server_info`), and its served model's name and weight version (`/model_info`).
Forgotten when the host's breaker closes again: a host that comes back may have restarted with other
settings, or another model.

What a server does not say stays None, never guessed. Each page is asked once per upstream, not per
record: a weight update on a live server (SGLang 0.5.23 `/update_weight_version`, or
`/update_weights_from_disk` with a `weight_version`) is seen only after the host is forgotten.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any

import httpx

from genfleet.workers.sglang.generate_stream import UNKNOWN, StreamMode


@dataclass(frozen=True)
class ModelIdentity:
    """The served model as its server reports it (SGLang 0.5.23 `entrypoints/http_server.py`):
    - `name`: `/model_info` `served_model_name`, else `model_path`;
    - `revision`: `/server_info` `revision`, the `--revision` (branch, tag or commit) the server was
      launched with: null by default (`arg_groups/fields/model.py`), and after a weight update still the
      launch's (`/server_info` reports the startup configuration);
    - `weight_version`: `/model_info` `weight_version`, "default" unless `--weight-version` or a weight
      update set it (`arg_groups/fields/serving.py`; the value in effect, `TokenizerManager.config_value`).
    """
    name: str
    revision: str | None = None
    weight_version: str | None = None

    def record_field(self) -> dict[str, str | None] | None:
        """The completion record's `model_revision`; None (left out of the record) when the server
        reported neither."""
        if self.revision is None and self.weight_version is None:
            return None
        return {"revision": self.revision, "weight_version": self.weight_version}


def identity_from_model_info(info: Any) -> ModelIdentity:
    """The name and weight version of a `/model_info` answer (its revision is `/server_info`'s)."""
    if not isinstance(info, dict):
        return ModelIdentity("unknown")
    name = str(info.get("served_model_name") or info.get("model_path") or "unknown")
    return ModelIdentity(name, weight_version=_reported(info.get("weight_version")))


def revision_from_server_info(info: Any) -> str | None:
    """`revision` of a `/server_info` answer: `server_args.resolved_dict()` flat, like every launch
    setting (sglang 0.5.23 `utils/common.py::build_server_info`)."""
    return _reported(info.get("revision")) if isinstance(info, dict) else None


class ServerInfo:
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

    def model_name(self, upstream: str) -> str:
        """The served model's name from `/model_info`."""
        return self._model(upstream).name

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
                return ModelIdentity("unknown")  # not cached: asked again with the next record
            model = self._models[upstream] = identity_from_model_info(info)
        return model

    def ask_server_info(self, upstream: str) -> dict[str, Any] | None:
        """The answer; None: could not ask now (asked again next time); {}: the server has no such
        page (the stream mode is then UNKNOWN, and the revision not reported)."""
        # /get_server_info is the older name, still an alias in 0.5.23 (entrypoints/http_server.py).
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


def _reported(value: Any) -> str | None:
    """A value as the server reported it; None where it is missing or not a string."""
    return value if isinstance(value, str) else None
