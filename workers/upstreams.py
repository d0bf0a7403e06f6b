"""Routes each generation to the SGLang host with the fewest requests in flight from this worker."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator


class NoUpstreamError(RuntimeError):
    pass


class UpstreamPool:
    def __init__(self, urls: list[str]) -> None:
        if not urls:
            raise NoUpstreamError("no SGLang upstream configured: pass --upstream URL (or GENFLEET_UPSTREAMS)")
        self.urls = [url.rstrip("/") for url in urls]
        self._in_flight = {url: 0 for url in self.urls}
        self._lock = threading.Lock()

    @contextmanager
    def lease(self, avoid: str | None = None) -> Iterator[str]:
        """Hold one slot on the least busy upstream; `avoid` (the last one that failed) loses ties."""
        with self._lock:
            url = min(self.urls, key=lambda u: (self._in_flight[u], u == avoid))
            self._in_flight[url] += 1
        try:
            yield url
        finally:
            with self._lock:
                self._in_flight[url] -= 1

    def in_flight(self) -> dict[str, int]:
        with self._lock:
            return dict(self._in_flight)
