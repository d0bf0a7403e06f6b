"""The ASGI edge of one generation: bytes straight to the server, and abort on client disconnect."""
from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from sim.engine import Engine, Generation

JSON_CONTENT_TYPE = b"application/json"
SSE_CONTENT_TYPE = b"text/event-stream; charset=utf-8"  # what Starlette sends for SGLang's streams


class GenerationResponse:
    """Runs one generation as an ASGI response and cancels it the moment the client goes away,
    so its slot is free at once, as SGLang aborts a request whose client disconnected."""

    def __init__(
        self,
        engine: Engine,
        generation: Generation,
        *,
        on_disconnect: Callable[[], None],
        on_done: Callable[[], None],
    ) -> None:
        self._engine = engine
        self._generation = generation
        self._on_disconnect = on_disconnect
        self._on_done = on_done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        work = asyncio.ensure_future(self._engine.run(self._generation, _AsgiResponder(send)))
        watch = asyncio.ensure_future(_disconnect(receive))
        try:
            await asyncio.wait((work, watch), return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not work.done():
                work.cancel()
                self._on_disconnect()
                await asyncio.wait((work,))  # let it release its slot before we return
            self._on_done()
        if not work.cancelled():
            work.result()  # surface a crash in the generation


async def read_body(receive: Receive) -> bytes:
    parts = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)


async def _disconnect(receive: Receive) -> None:
    # The body was read already, so the next message is the disconnect (or the response's end).
    while (await receive())["type"] != "http.disconnect":
        pass


class _AsgiResponder:
    """The engine's Responder: plain ASGI messages, one per write, without per-chunk wrappers."""

    def __init__(self, send: Send) -> None:
        self._send = send

    async def respond(self, status: int, body: bytes) -> None:
        headers = [(b"content-type", JSON_CONTENT_TYPE), (b"content-length", b"%d" % len(body))]
        await self._send({"type": "http.response.start", "status": status, "headers": headers})
        await self._send({"type": "http.response.body", "body": body})

    async def open_stream(self) -> None:
        headers = [(b"content-type", SSE_CONTENT_TYPE), (b"cache-control", b"no-cache")]
        await self._send({"type": "http.response.start", "status": 200, "headers": headers})

    async def write(self, data: bytes) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def close_stream(self, data: bytes) -> None:
        await self._send({"type": "http.response.body", "body": data})
