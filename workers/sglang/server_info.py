"""What each upstream says about itself, asked once and cached: its stream mode (`/server_info`)
and its served model's name (`/model_info`). Forgotten when the host's breaker closes again: a
host that comes back may have restarted with other settings.
"""
from __future__ import annotations

import threading

import httpx

from workers.sglang.generate_stream import UNKNOWN, StreamMode


class ServerInfo:
    def __init__(self, http: httpx.Client) -> None:
        self.http = http
        self._model_names: dict[str, str] = {}
        self._stream_modes: dict[str, StreamMode] = {}
        self._asking = threading.Lock()  # 150 threads starting at once ask /server_info once

    def forget(self, upstream: str) -> None:
        self._model_names.pop(upstream, None)
        self._stream_modes.pop(upstream, None)

    def stream_mode(self, upstream: str) -> StreamMode:
        """Cumulative or incremental chunks, as the server's `/server_info` says, asked once per
        upstream; UNKNOWN (infer from the chunks) where neither it nor `/get_server_info` answers."""
        mode = self._stream_modes.get(upstream)
        if mode is not None:
            return mode
        with self._asking:
            mode = self._stream_modes.get(upstream)
            if mode is None:
                mode = self._ask_stream_mode(upstream)
                if mode is not None:
                    self._stream_modes[upstream] = mode
        return mode or UNKNOWN

    def model_name(self, upstream: str) -> str:
        """The served model's name from `/model_info`."""
        name = self._model_names.get(upstream)
        if name is None:
            try:
                info = self.http.get(f"{upstream}/model_info", timeout=5.0).json()
            except (httpx.HTTPError, ValueError):
                return "unknown"  # not cached: asked again with the next record
            name = str(info.get("served_model_name") or info.get("model_path") or "unknown")
            self._model_names[upstream] = name
        return name

    def _ask_stream_mode(self, upstream: str) -> StreamMode | None:
        """None: could not ask now (asked again next time); UNKNOWN: the server has no such page."""
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
                return StreamMode.from_server_info(response.json())
            except ValueError:
                continue
        return UNKNOWN
