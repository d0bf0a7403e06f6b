"""`genfleet status --run R --serve PORT`: the run as a live web page (Starlette on uvicorn).

Routes: `/` the page, `/fragment` its refreshing part (`page.js` swaps it in every few seconds),
`/api/status.json` the object of `status --json` plus the minute series, histograms and latest
dead letters, and the page's own `page.css` and `page.js`. Only GETs: the page changes nothing.

Who may look, the rule `genfleet flower` follows: beyond loopback only behind basic auth with
`GENFLEET_FLOWER_AUTH` (`user:password`, checked by `workers.cli.flower_auth_problem`); on loopback
without it, requests must name a loopback host, so a web page that rebinds its own DNS name to
127.0.0.1 cannot read the run. When the variable is set, every address asks for it. A strict
content-security policy (scripts and styles from this server only) backs up `page_view`'s escaping.
"""
from __future__ import annotations

import base64
import binascii
import html
import ipaddress
import json
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import redis
import typer
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from genfleet.common import fleet_stats
from genfleet.common.keys import RunKeys
from genfleet.common.run_state import DeadLetter
from genfleet.status.alarms import AlarmSettings, alarms
from genfleet.status.history import read_minutes
from genfleet.status.page_view import RECENT_FAILURES, Failures, PageData, page_fragment, page_json, page_shell
from genfleet.status.read_model import read_status

REFRESH_MS = 3000
# Several open tabs share one read of Redis per second.
SNAPSHOT_MAX_AGE_S = 1.0
# Dead letters decoded per refresh at most: each carries its prompt, and a bad run may hold many.
FAILURES_SCANNED = 500
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
ASSETS = Path(__file__).parent
_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def serve_page(redis_url: str, run: str, *, port: int, bind: str, flower_url: str, auth: str | None,
               settings: AlarmSettings, redis_timeout_s: float) -> None:
    """The `--serve` branch of `genfleet status`: checks the flags and the auth rule, listens, serves."""
    from genfleet.common.run_state import connect
    from genfleet.workers.cli import flower_auth_problem, usage_error

    if problem := flower_url_problem(flower_url):
        usage_error(f"--flower-url {problem}")
    loopback = is_loopback(bind)
    if not loopback and not auth:
        usage_error(f"--bind {bind} is not a loopback address: the status page is served beyond this machine only "
                    "behind basic auth, as Flower is: set GENFLEET_FLOWER_AUTH=user:password, or keep --bind 127.0.0.1")
    if auth and (problem := flower_auth_problem(auth)):
        usage_error(problem)
    try:
        sock = listen(bind, port)
    except OSError as error:
        print(f"error: --serve {port} --bind {bind}: cannot listen there: {error.strerror or error}", file=sys.stderr)
        raise typer.Exit(1) from None
    bare = bind.strip("[]")
    where = f"[{bare}]" if ":" in bare else bare  # as a URL and a Host header name it
    hosts = None if auth else sorted({*LOOPBACK_NAMES, where})
    app = create_app(connect(redis_url, timeout_s=redis_timeout_s), run, flower_url=flower_url.rstrip("/"),
                     settings=settings, auth=auth, hosts=hosts)
    print(f"genfleet status: run {run} on http://{where}:{port}/ (JSON: /api/status.json"
          f"{', basic auth from GENFLEET_FLOWER_AUTH' if auth else ''}); Ctrl-C stops", flush=True)
    serve(app, sock)


def read_page(client: redis.Redis, run: str, flower_url: str) -> PageData:
    status = read_status(client, run)
    since = status.created_at or status.first_finished
    return PageData(status=status, minutes=read_minutes(client, run, status.time, since),
                    lengths=fleet_stats.read_lengths(client, run, [row.name for row in status.datasets]),
                    failures=read_failures(client, run), flower_url=flower_url)


def read_failures(client: redis.Redis, run: str, limit: int = RECENT_FAILURES,
                  scanned: int = FAILURES_SCANNED) -> Failures:
    """How many dead letters the run has, and the latest `limit` of the first `scanned` read."""
    key = RunKeys(run).dead_letters
    total = client.hlen(key)
    letters: list[DeadLetter] = []
    if total:
        for prompt_id, data in client.hscan_iter(key, count=100):
            letters.append(DeadLetter.decode(prompt_id, data))
            if len(letters) >= scanned:
                break
    letters.sort(key=lambda letter: letter.time, reverse=True)
    return Failures(total, letters[:limit], read=len(letters))


class _Snapshot:
    """The latest `PageData`, read again once older than `max_age_s` (one reader at a time)."""

    def __init__(self, read: Callable[[], PageData], max_age_s: float) -> None:
        self._read, self._max_age_s = read, max_age_s
        self._lock = threading.Lock()
        self._value: PageData | None = None
        self._at = 0.0

    def get(self) -> PageData:
        with self._lock:
            if self._value is None or time.monotonic() - self._at > self._max_age_s:
                self._value, self._at = self._read(), time.monotonic()
            return self._value


def create_app(client: redis.Redis, run: str, *, flower_url: str, settings: AlarmSettings,
               auth: str | None, hosts: list[str] | None) -> Starlette:
    """The page's app. `auth` (`user:password`) turns basic auth on; `hosts`, where given, are the
    only host names a request may address (a rebound DNS name is refused)."""
    snapshot = _Snapshot(lambda: read_page(client, run, flower_url), SNAPSHOT_MAX_AGE_S)

    def page(_: Request) -> Response:
        try:
            return _html(page_shell(run, _fragment(snapshot.get(), settings), REFRESH_MS))
        except redis.RedisError as error:
            return _html(page_shell(run, f'<p class="bad">{html.escape(_redis_problem(error))}</p>', REFRESH_MS), 503)

    def fragment(_: Request) -> Response:
        try:
            return _html(_fragment(snapshot.get(), settings))
        except redis.RedisError as error:
            return PlainTextResponse(_redis_problem(error), 503, headers=_HEADERS)

    def status_json(_: Request) -> Response:
        try:
            body, code = page_json(snapshot.get(), settings), 200
        except redis.RedisError as error:
            body, code = {"error": _redis_problem(error)}, 503
        return Response(json.dumps(body), code, headers=_HEADERS, media_type="application/json")

    def asset(name: str, media_type: str) -> Callable[[Request], Response]:
        content = (ASSETS / name).read_text()
        return lambda _: Response(content, headers=_HEADERS, media_type=media_type)

    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=hosts)] if hosts else []
    if auth:
        middleware.append(Middleware(BasicAuth, credentials=auth))
    return Starlette(routes=[
        Route("/", page), Route("/fragment", fragment), Route("/api/status.json", status_json),
        Route("/page.css", asset("page.css", "text/css")), Route("/page.js", asset("page.js", "text/javascript")),
    ], middleware=middleware)


class BasicAuth:
    """RFC 7617 basic auth against one `user:password`, compared in constant time."""

    def __init__(self, app: ASGIApp, credentials: str) -> None:
        self.app = app
        self.expected = credentials.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._admits(Headers(scope=scope).get("authorization", "")):
            response = PlainTextResponse("genfleet status: user and password required (GENFLEET_FLOWER_AUTH)", 401,
                                         headers={"WWW-Authenticate": 'Basic realm="genfleet status", charset="UTF-8"'})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _admits(self, header: str) -> bool:
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            given = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        return secrets.compare_digest(given, self.expected)


def is_loopback(bind: str) -> bool:
    if bind == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind.strip("[]")).is_loopback
    except ValueError:  # a host name: whatever it resolves to, it is not known to be loopback
        return False


def flower_url_problem(url: str) -> str | None:
    """Why `url` cannot be Flower's base URL in the page's links, or None."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return f"must be an http:// or https:// URL with a host, not {url!r}"
    if parts.query or parts.fragment:
        return f"must be a base URL without query or fragment, not {url!r}"
    return None


def listen(bind: str, port: int) -> socket.socket:
    """The listening socket, opened here so a busy port is one clear error, not uvicorn's log."""
    family, kind, proto, _, address = socket.getaddrinfo(bind.strip("[]"), port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def serve(app: Starlette, sock: socket.socket) -> None:
    """Until interrupted (Ctrl-C, SIGTERM: uvicorn's own handlers stop it cleanly)."""
    import uvicorn

    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])


def _fragment(data: PageData, settings: AlarmSettings) -> str:
    return page_fragment(data, alarms(data.status, settings))


def _html(content: str, code: int = 200) -> Response:
    return Response(content, code, headers=_HEADERS, media_type="text/html")


def _redis_problem(error: redis.RedisError) -> str:
    return f"Redis: {error or type(error).__name__} (retrying every {REFRESH_MS / 1000:.0f} s)"
