"""A tiny HTTP server in a thread of the test process, answering as the test says: a host whose
/health is up or down, a stream cut short. Starts no process."""
from __future__ import annotations

import http.server
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

Handler = Callable[[http.server.BaseHTTPRequestHandler], None]


@contextmanager
def http_stub(*, get: Handler | None = None, post: Handler | None = None) -> Iterator[str]:
    """Serves on a free loopback port while the block runs; yields its base URL. `get` / `post`
    answer each GET / POST (writing status, headers and body on the handler); others get a 501."""

    class Stub(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's naming
            self._answer(get)

        def do_POST(self):  # noqa: N802 - http.server's naming
            self._answer(post)

        def _answer(self, handler: Handler | None) -> None:
            if handler is None:
                self.send_error(501)
            else:
                handler(self)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def status_handler(status: Callable[[], int]) -> Handler:
    """Answers every request with `status()` and no body."""

    def answer(request: http.server.BaseHTTPRequestHandler) -> None:
        request.send_response(status())
        request.send_header("Content-Length", "0")
        request.end_headers()

    return answer
