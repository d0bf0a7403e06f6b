"""A raw-socket HTTP/1.1 server in a thread of the test process, for the streams' connections: it
answers each request with a whole chunked `/generate` stream and keeps the connection, or closes
it, or drops a request unanswered, as the test says. Starts no process."""
from __future__ import annotations

import json
import socketserver
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

FINAL = {"text": " a", "output_ids": [5], "meta_info": {"finish_reason": {"type": "stop"}, "completion_tokens": 1}}


@dataclass
class Seen:
    """What the server saw: one (connection number, request number on it, path, headers) a request."""

    requests: list[tuple[int, int, str, dict[str, str]]] = field(default_factory=list)
    connections: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


# How the server treats request `n` (0-based) of connection `c`: "answer" (a whole chunked stream,
# connection kept), "answer-close" (answer, then close it as a keep-alive timeout would), "cut"
# (every event, then close without the body's last chunk) or "drop" (read the request, close
# without a byte).
Behaviour = Callable[[int, int], str]


@contextmanager
def keep_alive_server(behaviour: Behaviour = lambda c, n: "answer",
                      tls: ssl.SSLContext | None = None) -> Iterator[tuple[str, Seen]]:
    """Serves on a free loopback port (over TLS with `tls`, a server context) while the block runs;
    yields its base URL and what it saw."""
    seen = Seen()

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            with seen.lock:
                number = seen.connections
                seen.connections += 1
            for request in range(10_000):
                line = self.rfile.readline()
                if not line:
                    return
                path = line.split()[1].decode()
                headers = {}
                while (header := self.rfile.readline()) not in (b"\r\n", b""):
                    name, _, value = header.decode().partition(":")
                    headers[name.strip().lower()] = value.strip()
                self.rfile.read(int(headers.get("content-length", 0)))
                with seen.lock:
                    seen.requests.append((number, request, path, headers))
                action = behaviour(number, request)
                if action == "drop":
                    return
                self.wfile.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                                 b"transfer-encoding: chunked\r\n\r\n")
                for event in (b"data: " + json.dumps(FINAL).encode() + b"\n\n", b"data: [DONE]\n\n"):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                if action == "cut":
                    self.wfile.flush()
                    return
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
                if action == "answer-close":
                    return

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True

        def get_request(self):  # type: ignore[override]
            sock, address = super().get_request()
            return (tls.wrap_socket(sock, server_side=True) if tls else sock), address

    server = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{'https' if tls else 'http'}://localhost:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
