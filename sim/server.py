"""The simulated SGLang server's HTTP surface: /generate's and /v1/chat/completions' validation,
and the info endpoints."""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict
from typing import Any

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from sim.capacity import Capacity
from sim.chat_request import ChatRequest, ChatTemplate, parse_chat_request
from sim.chat_wire import INTERNAL_ERROR_TYPE, ChatFrames, ChatOptions, openai_error_body
from sim.completion import CompletionPlan
from sim.completion_log import CompletionLog
from sim.engine import Engine, Frames, Generation, Served
from sim.faults import FaultInjector, FaultKind
from sim.generation_response import GenerationResponse, read_body
from sim.reasoning_formats import reasoning_format
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

GENERATE_METHODS = ("POST", "PUT")
CHAT_PATH = "/v1/chat/completions"
CHAT_METHODS = ("POST",)
JSON_MEDIA_TYPE = "application/json"


class SimServer:
    """One simulated SGLang server as an ASGI app: model tables, capacity, faults and routes."""

    def __init__(self, settings: SimSettings) -> None:
        self.settings = settings
        self.vocab = SimVocab.from_tokenizer_dir(settings.tokenizer_dir)
        self.reasoning_format = reasoning_format(settings.reasoning_format)
        self.reasoning_format.check(self.vocab)  # fail at start, not on the first request
        self.encoder = ChunkEncoder(self.vocab)
        self.chat_template = ChatTemplate(settings.tokenizer_dir)
        self.capacity = Capacity(settings.capacity)
        self.engine = Engine(self.capacity, tick=settings.tick)
        self.faults = FaultInjector(settings.faults)
        self.log = CompletionLog(settings.log_completions) if settings.log_completions else None
        self.shutting_down = False
        self._rids_in_flight: set[str] = set()
        self._created = int(time.time())
        self._routes = Starlette(
            routes=[
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

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The generation routes carry every token, so they skip Starlette's routing and
        # middleware, which would otherwise wrap each chunk's `send` in two more coroutines.
        path = scope["path"] if scope["type"] == "http" else None
        if path == "/generate" or path == CHAT_PATH:
            try:
                response = await (self._generate if path == "/generate" else self._chat)(scope, receive)
            except ClientDisconnect:
                return  # gone before its request was read
            await response(scope, receive, send)
        else:
            await self._routes(scope, receive, send)

    # -- /generate ----------------------------------------------------------------------------

    async def _generate(self, scope: Scope, receive: Receive) -> ASGIApp:
        if scope["method"] not in GENERATE_METHODS:
            return PlainTextResponse("Method Not Allowed", 405, headers={"allow": ", ".join(GENERATE_METHODS)})
        try:
            body = json.loads(await read_body(receive))
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
        return self._respond(generation, rid)

    def _prepare(self, request: GenerateRequest) -> tuple[Generation, str]:
        prompt = request.prompt
        prompt_tokens = len(prompt) if isinstance(prompt, list) else len(self.vocab.encode(prompt))
        rid = self._admit(prompt_tokens, request.rid)
        plan = self.settings.plan(prompt, vocab=self.vocab, seed=request.sampling_seed,
                                  max_new_tokens=request.max_new_tokens)
        frames = self.encoder.frames(
            plan,
            rid=rid,
            prompt_tokens=prompt_tokens,
            skip_special_tokens=request.skip_special_tokens,
            incremental=self.settings.incremental,
            error_format=self.settings.faults.error_format,
        )
        prompt_field = {"input_ids": prompt} if isinstance(prompt, list) else {"input_text": prompt}
        generation = self._generation(
            plan, frames, prompt_tokens, request.stream, request.stream_interval,
            log_head={"rid": rid, "api": "generate", **prompt_field},
        )
        return generation, rid

    def _invalid(self, message: str, *, streaming: bool) -> Response:
        if streaming:  # SGLang validates inside the stream, after a 200 went out
            chunk = invalid_request_chunk(message, self.settings.faults.error_format)
            return Response(chunk + DONE, 200, media_type=SSE_MEDIA_TYPE)
        return Response(message_error_body(message), 400, media_type=JSON_MEDIA_TYPE)

    # -- shared by both APIs ------------------------------------------------------------------

    def _admit(self, prompt_tokens: int, rid: str | None, prefix: str = "") -> str:
        """Check the prompt fits and the rid is free; returns the rid."""
        if prompt_tokens >= self.settings.context_length:
            raise InvalidRequest(
                f"The input ({prompt_tokens} tokens) is longer than the model's context length "
                f"({self.settings.context_length} tokens)."
            )
        rid = rid if rid is not None else prefix + uuid.uuid4().hex
        if rid in self._rids_in_flight:
            raise InvalidRequest(f"Duplicate request ID detected: {rid}")
        return rid

    def _generation(
        self,
        plan: CompletionPlan,
        frames: Frames,
        prompt_tokens: int,
        stream: bool,
        stream_interval: int | None,
        *,
        log_head: dict[str, Any],
    ) -> Generation:
        interval = self.settings.effective_stream_interval(stream_interval)
        on_served = None
        if self.log is not None:
            log, incremental = self.log, self.settings.incremental and stream

            def on_served(served: Served) -> None:
                log.write({
                    **log_head,
                    "output_ids": plan.output_ids[: served.generated],
                    **frames.streamed(served.generated),
                    "finish_reason": served.finish_reason,
                    "completion_tokens": min(served.generated, len(plan.output_ids)),
                    "stream": stream,
                    "stream_interval": interval,
                    "incremental": incremental,
                    "faults": list(served.faults),
                })

        return Generation(
            plan=plan,
            frames=frames,
            prompt_tokens=prompt_tokens,
            stream=stream,
            stream_interval=interval,
            fault=self.faults.draw(),  # one draw per admitted request, in arrival order
            steps=self.settings.steps,
            corruption=self.faults.draw_corruption(),  # also one per admitted request
            on_served=on_served,
        )

    def _respond(self, generation: Generation, rid: str) -> ASGIApp:
        self._rids_in_flight.add(rid)
        return GenerationResponse(
            self.engine, generation, on_disconnect=self.capacity.record_disconnected,
            on_done=lambda: self._rids_in_flight.discard(rid),
        )

    # -- /v1/chat/completions -----------------------------------------------------------------

    async def _chat(self, scope: Scope, receive: Receive) -> ASGIApp:
        if scope["method"] not in CHAT_METHODS:
            return PlainTextResponse("Method Not Allowed", 405, headers={"allow": ", ".join(CHAT_METHODS)})
        try:
            body = json.loads(await read_body(receive))
        except ValueError as error:
            return _bad_request(f"invalid JSON body: {error}")
        try:
            request = parse_chat_request(body)
            await self.chat_template.load()
            generation, rid = self._prepare_chat(request, self.chat_template.prompt_ids(request))
        except BadRequest as error:
            return _bad_request(str(error))
        except InvalidRequest as error:
            # 0.5.23 starts the generator before the 200, so even a stream gets a plain 400.
            return Response(openai_error_body(str(error)), 400, media_type=JSON_MEDIA_TYPE)
        if generation.fault and generation.fault.kind is FaultKind.HTTP_500:
            body = openai_error_body("Internal server error", err_type=INTERNAL_ERROR_TYPE, code=500)
            return Response(body, 500, media_type=JSON_MEDIA_TYPE)
        return self._respond(generation, rid)

    def _prepare_chat(self, request: ChatRequest, prompt_ids: list[int]) -> tuple[Generation, str]:
        settings = self.settings
        prompt_tokens = len(prompt_ids)
        if request.max_tokens is not None and request.max_tokens > settings.context_length:
            raise InvalidRequest(
                f"max_completion_tokens is too large: {request.max_tokens}."
                f"This model supports at most {settings.context_length} completion tokens."
            )
        rid = self._admit(prompt_tokens, request.rid, prefix="chatcmpl-")
        # Without a limit SGLang generates up to the context length.
        max_new_tokens = settings.chat_max_new_tokens(prompt_tokens, request.max_tokens)
        plan = settings.plan(prompt_ids, vocab=self.vocab, seed=request.seed, max_new_tokens=max_new_tokens)
        gpt_oss = self.reasoning_format.name == "gpt-oss"
        options = ChatOptions(
            completion_id=rid,
            created=int(time.time()),
            model=request.model,
            prompt_tokens=prompt_tokens,
            separate_reasoning=request.separate_reasoning and self.reasoning_format.name != "none",
            # SGLang keeps special tokens for gpt-oss, whose Harmony parser needs them.
            skip_special_tokens=request.skip_special_tokens and not gpt_oss,
            stream_reasoning=request.stream_reasoning,
            include_usage=request.include_usage,
            continuous_usage_stats=request.continuous_usage_stats,
        )
        table = self.encoder.text_table(skip_special_tokens=options.skip_special_tokens)
        frames = ChatFrames(plan, table=table, options=options)
        log_head = {"rid": rid, "api": "chat", "input_ids": prompt_ids}
        return self._generation(plan, frames, prompt_tokens, request.stream, None, log_head=log_head), rid

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
                "reasoning_parser": self.reasoning_format.name,
                "tool_call_parser": None,
                "disaggregation_mode": "null",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "sim",
                "architectures": ["SimForCausalLM"],
            }
        )

    async def server_info(self, request: Request) -> Response:
        """`/server_info` and its deprecated alias `/get_server_info` (sglang 0.5.23
        `entrypoints/http_server.py`). With --no-server-info both are missing, FastAPI's 404, like
        a router or server that does not answer them: clients must infer the streaming mode."""
        settings = self.settings
        if not settings.server_info:
            return JSONResponse({"detail": "Not Found"}, 404)
        return JSONResponse(
            {
                "model_path": str(settings.tokenizer_dir),
                "context_length": settings.context_length,
                "stream_interval": settings.stream_interval,
                "incremental_streaming_output": settings.incremental,
                "reasoning_parser": self.reasoning_format.name,
                "random_seed": settings.seed,
                "sim": {
                    "capacity": asdict(settings.capacity),
                    "lengths": asdict(settings.lengths),
                    "steps": asdict(settings.steps),
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


def _bad_request(message: str) -> Response:
    """FastAPI's validation errors, which SGLang turns into 400s."""
    body = {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400}
    return Response(dumps(body), 400, media_type=JSON_MEDIA_TYPE)
