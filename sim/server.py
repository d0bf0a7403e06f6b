"""The simulated SGLang HTTP server: its routes, the ASGI edge of each generation, and the runner."""
from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
import uuid
from dataclasses import asdict
from types import FrameType
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from sim.capacity import Capacity
from sim.completion import plan_completion
from sim.engine import Engine, Generation
from sim.faults import FaultInjector, FaultKind
from sim.request import BadRequest, GenerateRequest, InvalidRequest, SchemaError, parse_generate_request
from sim.settings import SimSettings
from sim.vocab import SimVocab
from sim.wire import (
    DONE,
    SSE_MEDIA_TYPE,
    ChunkEncoder,
    dumps,
    invalid_request_chunk,
    message_error_body,
    schema_error_body,
)

JSON_MEDIA_TYPE = "application/json"
SSE_CONTENT_TYPE = f"{SSE_MEDIA_TYPE}; charset=utf-8"  # what Starlette sends for SGLang's streams
GRACEFUL_SHUTDOWN_S = 2.0  # stalled streams never end by themselves


class SimServer:
    """One simulated SGLang server: settings, model tables, capacity and the Starlette app."""

    def __init__(self, settings: SimSettings) -> None:
        self.settings = settings
        self.vocab = SimVocab.from_tokenizer_dir(settings.tokenizer_dir)
        self.encoder = ChunkEncoder(self.vocab)
        self.capacity = Capacity(settings.capacity)
        self.engine = Engine(self.capacity, tick=settings.tick)
        self.faults = FaultInjector(settings.faults)
        self.shutting_down = False
        self._rids_in_flight: set[str] = set()
        self._created = int(time.time())
        generate = ["POST", "PUT"]
        self.app = Starlette(
            routes=[
                Route("/generate", self.generate, methods=generate),
                Route("/health", self.health),
                Route("/health_generate", self.health),
                Route("/model_info", self.model_info),
                Route("/get_model_info", self.model_info),
                Route("/server_info", self.server_info),
                Route("/get_server_info", self.server_info),
                Route("/v1/models", self.models),
                Route("/flush_cache", self.flush_cache, methods=["GET", "POST"]),
                Route("/", self.root),
                Route("/sim/stats", self.stats),
                Route("/sim/stats/reset", self.reset_stats, methods=["POST"]),
            ]
        )

    # -- /generate ----------------------------------------------------------------------------

    async def generate(self, request: Request) -> Any:
        try:
            body = json.loads(await request.body())
        except ValueError as error:
            return _bad_request(f"invalid JSON body: {error}")
        streaming = isinstance(body, dict) and body.get("stream") is True
        try:
            generation, rid = self._prepare(parse_generate_request(body))
        except BadRequest as error:
            return _bad_request(str(error))
        except SchemaError as error:
            return Response(schema_error_body(str(error)), 400, media_type=JSON_MEDIA_TYPE)
        except InvalidRequest as error:
            return self._invalid(str(error), streaming=streaming)
        if generation.fault and generation.fault.kind is FaultKind.HTTP_500:
            return Response(message_error_body("Internal server error"), 500, media_type=JSON_MEDIA_TYPE)
        self._rids_in_flight.add(rid)
        return GenerationResponse(self, generation, rid)

    def _prepare(self, request: GenerateRequest) -> tuple[Generation, str]:
        settings = self.settings
        prompt = request.prompt
        prompt_tokens = len(prompt) if isinstance(prompt, list) else len(self.vocab.encode(prompt))
        if prompt_tokens >= settings.context_length:
            raise InvalidRequest(
                f"The input ({prompt_tokens} tokens) is longer than the model's context length "
                f"({settings.context_length} tokens)."
            )
        rid = request.rid if request.rid is not None else uuid.uuid4().hex
        if rid in self._rids_in_flight:
            raise InvalidRequest(f"Duplicate request ID detected: {rid}")
        plan = plan_completion(
            prompt,
            seed=request.sampling_seed if request.sampling_seed is not None else settings.seed,
            max_new_tokens=request.max_new_tokens,
            lengths=settings.lengths,
            vocab=self.vocab,
        )
        frames = self.encoder.frames(
            plan,
            rid=rid,
            prompt_tokens=prompt_tokens,
            skip_special_tokens=request.skip_special_tokens,
            incremental=settings.incremental,
        )
        generation = Generation(
            plan=plan,
            frames=frames,
            prompt_tokens=prompt_tokens,
            stream=request.stream,
            stream_interval=max(1, request.stream_interval or settings.stream_interval),
            fault=self.faults.draw(),
            error_format=settings.faults.error_format,
        )
        return generation, rid

    def _invalid(self, message: str, *, streaming: bool) -> Response:
        if streaming:  # SGLang validates inside the stream, after a 200 went out
            chunk = invalid_request_chunk(message, self.settings.faults.error_format)
            return Response(chunk + DONE, 200, media_type=SSE_MEDIA_TYPE)
        return Response(message_error_body(message), 400, media_type=JSON_MEDIA_TYPE)

    def finished(self, rid: str) -> None:
        self._rids_in_flight.discard(rid)

    # -- info and health ----------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        return Response(status_code=503 if self.shutting_down else 200)

    async def model_info(self, request: Request) -> Response:
        path = str(self.settings.tokenizer_dir)
        return JSONResponse(
            {
                "model_path": path,
                "served_model_name": path,
                "tokenizer_path": path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "load_format": "auto",
                "reasoning_parser": "kimi_k2",
                "tool_call_parser": None,
                "disaggregation_mode": "null",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "sim",
                "architectures": ["SimForCausalLM"],
            }
        )

    async def server_info(self, request: Request) -> Response:
        settings = self.settings
        return JSONResponse(
            {
                "model_path": str(settings.tokenizer_dir),
                "context_length": settings.context_length,
                "stream_interval": settings.stream_interval,
                "incremental_streaming_output": settings.incremental,
                "reasoning_parser": "kimi_k2",
                "random_seed": settings.seed,
                "sim": {
                    "capacity": asdict(settings.capacity),
                    "lengths": asdict(settings.lengths),
                    "faults": {**asdict(settings.faults), "error_format": settings.faults.error_format.value},
                    "tick": settings.tick,
                },
                "version": "0.5.23",
                "frontend": "python",
            }
        )

    async def models(self, request: Request) -> Response:
        name = str(self.settings.tokenizer_dir)
        card = {
            "id": name,
            "object": "model",
            "created": self._created,
            "owned_by": "sglang",
            "root": name,
            "parent": None,
            "max_model_len": self.settings.context_length,
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def flush_cache(self, request: Request) -> Response:
        return PlainTextResponse(
            "Cache flushed.\nPlease check backend logs for more details. (When there are running or "
            "waiting requests, the operation will not be performed.)\n"
        )

    async def root(self, request: Request) -> Response:
        return PlainTextResponse("SGLang is running")

    async def stats(self, request: Request) -> Response:
        return JSONResponse(asdict(self.capacity.stats()))

    async def reset_stats(self, request: Request) -> Response:
        self.capacity.reset_stats()
        return JSONResponse(asdict(self.capacity.stats()))


class GenerationResponse:
    """An ASGI response that runs one generation and cancels it the moment the client goes away."""

    def __init__(self, server: SimServer, generation: Generation, rid: str) -> None:
        self._server = server
        self._generation = generation
        self._rid = rid

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        capacity = self._server.capacity
        work = asyncio.ensure_future(self._server.engine.run(self._generation, _AsgiResponder(send)))
        watch = asyncio.ensure_future(_disconnect(receive))
        try:
            await asyncio.wait((work, watch), return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not work.done():
                work.cancel()
                capacity.record_disconnected()
                await asyncio.wait((work,))  # let it release its slot before we return
            self._server.finished(self._rid)
        if not work.cancelled():
            work.result()  # surface a crash in the generation


async def _disconnect(receive: Receive) -> None:
    # The body was read already, so the next message is the disconnect (or the response's end).
    while (await receive())["type"] != "http.disconnect":
        pass


class _AsgiResponder:
    """Writes a generation's bytes straight to the ASGI server, without per-chunk wrappers."""

    def __init__(self, send: Send) -> None:
        self._send = send

    async def respond(self, status: int, body: bytes) -> None:
        headers = [(b"content-type", JSON_MEDIA_TYPE.encode()), (b"content-length", b"%d" % len(body))]
        await self._send({"type": "http.response.start", "status": status, "headers": headers})
        await self._send({"type": "http.response.body", "body": body})

    async def open_stream(self) -> None:
        headers = [(b"content-type", SSE_CONTENT_TYPE.encode()), (b"cache-control", b"no-cache")]
        await self._send({"type": "http.response.start", "status": 200, "headers": headers})

    async def write(self, data: bytes) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def close_stream(self, data: bytes) -> None:
        await self._send({"type": "http.response.body", "body": data})


def _bad_request(message: str) -> Response:
    """FastAPI's validation errors, which SGLang turns into 400s."""
    body = {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400}
    return Response(dumps(body), 400, media_type=JSON_MEDIA_TYPE)


# -- runner --------------------------------------------------------------------------------------


class _SimUvicorn(uvicorn.Server):
    """uvicorn that flags the shutdown for /health and can die on schedule."""

    def __init__(self, config: uvicorn.Config, sim: SimServer) -> None:
        super().__init__(config)
        self.sim = sim

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if not self.started:
            return
        settings = self.sim.settings
        print(f"sim listening on {settings.url} ({settings.describe()})", flush=True)
        if settings.faults.die_after is not None:
            asyncio.get_running_loop().call_later(settings.faults.die_after, _die, settings.faults.die_after)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.sim.shutting_down = True
        super().handle_exit(sig, frame)


def _die(after: float) -> None:
    print(f"sim: dying abruptly, as --die-after {after:g} asked", file=sys.stderr, flush=True)
    os._exit(1)  # no cleanup, no goodbye: a crashed host


def serve(settings: SimSettings) -> None:
    """Run a simulated server in the foreground until interrupted."""
    sim = SimServer(settings)
    config = uvicorn.Config(
        sim.app,
        host=settings.host,
        port=settings.port,
        loop="auto",  # uvloop and httptools when installed
        http="auto",
        lifespan="off",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    _SimUvicorn(config, sim).run()
