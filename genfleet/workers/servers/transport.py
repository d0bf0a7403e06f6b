"""The streams' HTTP, under every server kind: kept HTTP/1.1 connections over the standard library,
and the server-sent events read from their bodies.

The `data:` payloads of a server-sent event stream, read from its body's bytes as they arrive.

Servers stream `data: <json>\n\n` events ending with `data: [DONE]` (SGLang 0.5.23
`entrypoints/http_server.py` `stream_results`; the OpenAI API's streams read the same). Reading
bytes and splitting lines here, rather than through httpx's `iter_lines` (an incremental UTF-8
decoder, then a line decoder over text), keeps each chunk to one split and one `json.loads` of
bytes: the chunk is the unit of a worker's streaming cost. Line ends are LF, CRLF or a lone CR, as
the event-stream format allows (WHATWG HTML, "Server-sent events", parsing an event stream); any
block boundary gives the same lines.

HTTP/1.1 for the generation streams: kept connections per upstream, shared by the task threads,
through the standard library's `http.client`.

Why not httpx, which the worker keeps for its short requests (/server_info, /abort_request, /health):
per chunk, httpx, httpcore and h11 each add a layer of Python (events, state machines, stream
wrappers) to what `http.client` does in one `read1`, and a worker reads ~150 streams at once on
threads that hand the GIL over at every chunk. Measured end to end (`python -m bench.throughput
--side genfleet`, 2,000 prompts, 4 runs each alternating with the httpx version): 11.3 µs of worker
CPU per generated token against 14.1, about 1.2 ms less per task.

What the pool did is kept: a connection goes back for the next stream only when its response was
read to the end (`HTTPResponse.isclosed()`), a stream cut short closes it (so the server sees the
client leave), a kept connection the server has closed meanwhile is noticed before reuse, and one
found closed as the request is sent is replaced once; a request already sent is never sent again.
"""
from __future__ import annotations

import base64
import http.client
import json
import select
import socket
import ssl
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from genfleet.workers.errors import SendFailed, UpstreamURLError


def data_payloads(blocks: Iterable[bytes]) -> Iterator[bytes]:
    """Each `data:` line's payload, stripped, in order; other lines (comments, `event:`) skipped."""
    pending = b""
    for block in blocks:
        if pending:
            block = pending + block
        # A CR that ends the block may be the first half of a CRLF cut between blocks.
        end = len(block) - 1 if block.endswith(b"\r") else len(block)
        lines = block[:end].replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        pending = lines.pop() + block[end:]
        for line in lines:
            if line.startswith(b"data:"):
                yield line[5:].strip()
    last = pending.rstrip(b"\r")  # a last line without its line end
    if last.startswith(b"data:"):
        yield last[5:].strip()


# A kept connection failing this way as a request goes out was closed by the server meanwhile.
STALE_CONNECTION = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError,
                    ssl.SSLEOFError)
READ_SIZE = 65536
ERROR_BODY_LIMIT = 65536


@dataclass(frozen=True)
class Origin:
    """Where an upstream URL's requests go: scheme, host and port, the path every endpoint is under
    (a router may serve a server below a prefix) and the basic-auth header of any user:password in it."""

    https: bool
    host: str
    port: int
    path: str
    authorization: str | None

    @classmethod
    def parse(cls, url: str) -> Origin:
        """Raises UpstreamURLError saying what is wrong (the worker's CLI prints it at start)."""
        if not url.isascii():
            raise UpstreamURLError("has characters that are not ASCII (percent-encode them, or use the IDNA host name)")
        try:
            parts = urlsplit(url)
            port = parts.port  # raises ValueError for a port that is not a number in range
        except ValueError as error:
            raise UpstreamURLError(f"not a URL ({error})") from None
        if parts.scheme not in ("http", "https"):
            raise UpstreamURLError("must start with http:// or https:// (e.g. http://gpu1:30000)")
        if not parts.hostname:
            raise UpstreamURLError("has no host (e.g. http://gpu1:30000)")
        authorization = None
        if parts.username is not None:
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            authorization = "Basic " + base64.b64encode(pair).decode()
        https = parts.scheme == "https"
        return cls(https, parts.hostname, port or (443 if https else 80), parts.path.rstrip("/"), authorization)


class _StallTimeout:
    """Connect within the connect timeout, then read with the stall timeout: `http.client` has one
    timeout for both, and a stream may rightly stay silent longer than a connect should take."""

    stall_timeout_s: float

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        self.sock.settimeout(self.stall_timeout_s)  # type: ignore[attr-defined]


class _Connection(_StallTimeout, http.client.HTTPConnection):
    pass


class _TLSConnection(_StallTimeout, http.client.HTTPSConnection):
    pass


class StreamConnections:
    """Kept connections, a stack per upstream shared by every thread: a stream takes the one used
    last (the least likely to have timed out) or opens one, and gives it back once read to the
    end. The stacks never hold more than the upstream's peak in flight, as httpx's bounded pool
    did, without its walk over every connection per request (httpcore 1.0.9
    `_assign_requests_to_connections`, O(n²) at n connections)."""

    def __init__(self, *, connect_timeout_s: float, stall_timeout_s: float, tls: ssl.SSLContext) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.stall_timeout_s = stall_timeout_s
        self._tls = tls
        self._origins: dict[str, Origin] = {}
        self._lock = threading.Lock()
        self._idle: dict[str, list[http.client.HTTPConnection]] = {}
        self._reading: set[socket.socket] = set()  # of the streams being read now
        self._closed = False
        self._interrupted = False  # the worker is stopping: a dropped connection is not replaced

    @contextmanager
    def post(self, upstream: str, path: str, body: dict[str, Any]) -> Iterator[StreamResponse]:
        """POST `body` as JSON to `upstream + path`; yields the response with its headers read. On
        leaving, a response not read to its end closes the connection; one read to its end goes
        back for the next stream."""
        origin = self._origin(upstream)
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream",
                   "User-Agent": "genfleet"}
        if origin.authorization:
            headers["Authorization"] = origin.authorization
        # httpx's own encoding of `json=` (0.28 `_content.py::encode_json`).
        payload = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        connection, sock, response = self._request(upstream, origin, origin.path + path, payload, headers)
        stream = StreamResponse(response)
        try:
            yield stream
        finally:
            with self._lock:
                self._reading.discard(sock)
            if not stream.complete:
                response.close()  # with `Connection: close` the response holds the socket, not the connection
            self._give_back(upstream, connection, reusable=stream.complete)

    def interrupt(self) -> None:
        """Wake every thread blocked reading a stream: shutdown makes a blocked recv() return at
        once, where close() from another thread may not. Each stream then ends short."""
        with self._lock:
            self._interrupted = True
            reading = list(self._reading)
        for sock in reading:
            _shut(sock)

    def close(self) -> None:
        """Close the kept connections; one in use now is closed when its stream ends."""
        with self._lock:
            self._closed = True
            idle = [connection for stack in self._idle.values() for connection in stack]
            self._idle.clear()
        for connection in idle:
            connection.close()

    def _origin(self, upstream: str) -> Origin:
        origin = self._origins.get(upstream)
        if origin is None:
            origin = self._origins[upstream] = Origin.parse(upstream)
        return origin

    def _take(self, upstream: str, origin: Origin) -> http.client.HTTPConnection:
        with self._lock:
            stack = self._idle.get(upstream)
            connection = stack.pop() if stack else None
        if connection is None:
            return self._new_connection(origin)
        if connection.sock is not None and _closed_by_peer(connection.sock):
            connection.close()  # the server's keep-alive timeout passed: request() connects again
        return connection

    def _give_back(self, upstream: str, connection: http.client.HTTPConnection, *, reusable: bool) -> None:
        # A response the server ended with `Connection: close` has already closed the socket.
        if reusable and connection.sock is not None:
            with self._lock:
                if not self._closed:
                    self._idle.setdefault(upstream, []).append(connection)
                    return
        connection.close()

    def _new_connection(self, origin: Origin) -> http.client.HTTPConnection:
        connection: http.client.HTTPConnection
        if origin.https:
            connection = _TLSConnection(origin.host, origin.port, timeout=self.connect_timeout_s, context=self._tls)
        else:
            connection = _Connection(origin.host, origin.port, timeout=self.connect_timeout_s)
        connection.stall_timeout_s = self.stall_timeout_s
        return connection

    def _request(self, upstream: str, origin: Origin, path: str, payload: bytes, headers: dict[str, str],
                 ) -> tuple[http.client.HTTPConnection, socket.socket, http.client.HTTPResponse]:
        """Send the request and read the response's head; the connection, its socket (registered
        for `interrupt`) and the response. Failing to send raises SendFailed, after one more try on
        a new connection when a kept one was found closed as the request went out. A failure once
        the request is out is not retried here: the server may have taken it (a proxy that dropped
        the connection after forwarding it), and sending it again would generate it twice."""
        if self._interrupted:
            raise SendFailed(ConnectionAbortedError("the worker is stopping"))
        connection = self._take(upstream, origin)
        for attempt in (1, 2):
            reused = connection.sock is not None
            try:
                connection.request("POST", path, body=payload, headers=headers)
            except (OSError, http.client.HTTPException) as error:
                connection.close()
                if reused and attempt == 1 and isinstance(error, STALE_CONNECTION) and not self._interrupted:
                    connection = self._new_connection(origin)
                    continue
                raise SendFailed(error) from None
            except BaseException:
                connection.close()
                raise
            sock = connection.sock
            assert sock is not None
            with self._lock:
                self._reading.add(sock)
                interrupted = self._interrupted
            if interrupted:  # `interrupt` ran as this request went out: cut it as it would have
                _shut(sock)
            try:
                return connection, sock, connection.getresponse()
            except BaseException:
                connection.close()
                with self._lock:
                    self._reading.discard(sock)
                raise
        raise AssertionError("unreachable")


def _closed_by_peer(sock: socket.socket) -> bool:
    """An idle kept connection is readable only if the server closed it (or broke the protocol):
    either way it cannot carry the next request. httpcore 1.0.9 checks the same before reuse
    (`_utils.py::is_socket_readable`, poll() because select() fails above fd 1023)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed


class StreamResponse:
    """A response being read: its status, its body's blocks, and whether the body was read to its
    end. Only then may the connection carry another request: `HTTPResponse.isclosed()` alone does
    not say so (a chunked body cut at a chunk boundary closes the response, then raises)."""

    def __init__(self, response: http.client.HTTPResponse) -> None:
        self._response = response
        self.status = response.status
        self.complete = False

    def blocks(self, finished: Callable[[], bool]) -> Iterator[bytes]:
        """The body's blocks as they arrive, read to its end (which lets the connection be kept).
        Once the final chunk has arrived, a transport error ends the body instead: the generation
        is whole and only the connection is lost."""
        while True:
            try:
                block = self._response.read1(READ_SIZE)
            except (OSError, http.client.HTTPException):
                if finished():
                    return
                raise
            if not block:
                self.complete = True
                return
            yield block

    def error_body(self) -> bytes:
        """Up to 64 KiB of a refused request's body, for its error message."""
        try:
            body = self._response.read(ERROR_BODY_LIMIT)
        except (OSError, http.client.HTTPException):
            return b""
        self.complete = self._response.isclosed()
        return body


def upstream_problem(url: str) -> str | None:
    """Why `url` is not a server's base URL (http:// or https:// and a host), or None."""
    try:
        Origin.parse(url)
    except UpstreamURLError as error:
        return str(error)
    return None
