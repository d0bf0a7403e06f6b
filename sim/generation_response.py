"""The ASGI edge of one generation: bytes straight to the server, and the client's leaving
reported to the request's control, which aborts it when SGLang would (sim.aborts)."""
from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from genfleet.sim.aborts import RequestControl
from genfleet.sim.engine import Engine, Generation

JSON_CONTENT_TYPE = b"application/json"
SSE_CONTENT_TYPE = b"text/event-stream; charset=utf-8"  # what Starlette sends for SGLang's streams


class GenerationResponse:
    """Runs one generation as an ASGI response. A client that goes away does not end it: the
    generation decodes on until its control aborts it (or it finishes), its bytes dropped, and
    this response returns once it has ended."""

    def __init__(
        self,
        engine: Engine,
        generation: Generation,
        control: RequestControl,
        *,
        on_done: Callable[[], None],
    ) -> None:
        self._engine = engine
        self._generation = generation
        self._control = control
        self._on_done = on_done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        responder = _AsgiResponder(send)
        work = asyncio.ensure_future(self._engine.run(self._generation, responder, self._control))
        watch = asyncio.ensure_future(_disconnect(receive))
        try:
            await asyncio.wait((work, watch), return_when=asyncio.FIRST_COMPLETED)
            if not work.done():
                responder.gone = True
                self._control.client_left()
                await asyncio.wait((work,))
        finally:
            watch.cancel()
            if not work.done():  # we were cancelled (the server is stopping): so is the generation
                work.cancel()
                await asyncio.wait((work,))  # let it release its slot before we return
            self._control.close()
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
    """The engine's Responder: plain ASGI messages, one per write, without per-chunk wrappers;
    nothing once the client is gone."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.gone = False

    async def respond(self, status: int, body: bytes) -> None:
        if self.gone:
            return
        headers = [(b"content-type", JSON_CONTENT_TYPE), (b"content-length", b"%d" % len(body))]
        await self._send({"type": "http.response.start", "status": status, "headers": headers})
        await self._send({"type": "http.response.body", "body": body})

    async def open_stream(self) -> None:
        headers = [(b"content-type", SSE_CONTENT_TYPE), (b"cache-control", b"no-cache")]
        await self._send({"type": "http.response.start", "status": 200, "headers": headers})

    async def write(self, data: bytes) -> None:
        if self.gone:
            return
        await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def close_stream(self, data: bytes) -> None:
        if self.gone:
            return
        await self._send({"type": "http.response.body", "body": data})
