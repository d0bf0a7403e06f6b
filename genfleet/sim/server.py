"""The simulator's HTTP server: its routes, the generation and info endpoints, the responses and the
completion log.

`--log-completions PATH`: one JSON line per request whose response went out whole.

A line is written when a stream has sent its last chunk (or error chunk) and `[DONE]`, or a
non-streaming response its body; never for a stalled request (unless /abort_request ends it), one
whose client left, or an HTTP 500 answered before anything ran. It says what the server sent, as
the ground truth for a client's integrity checks:

    {"rid": ..., "api": "generate" | "chat",
     "continues": "<rid>",         only on a request that continues a cut completion
                                    (sim.completion): its output_ids and text are the tail only
     "input_ids": [...]            (or "input_text": "..." for a /generate text prompt;
                                    a chat request logs its chat template's ids),
     "output_ids": [...],          every id sent, a matched stop id included
     "text": "...",                all the text sent, the stop token trimmed, as skip_special_tokens
                                    said (chat: the reasoning and content deltas joined; the line
                                    then also holds "reasoning_content" and "content")
     "finish_reason": {...} | null (null after an error; an abort's, sim.engine, says "abort"),
     "completion_tokens": n,       == len(output_ids): the true count
     "stream": bool, "stream_interval": n, "incremental": bool,
     "faults": [...]}              "abort", "error_chunk", "stall", "drop_chunk", "miscount"

A request aborted by /abort_request while its client reads gets a line (its last chunk went out);
`faults` then lists what struck before the abort ("stall", "drop_chunk"). A client that left gets
none, even if the request decoded on to its finish.

Corruptions are not applied to the line: a dropped chunk's ids and text are in it, and
`completion_tokens` is the true count even when the response reported one more; `faults` says
how what the client got differs ("miscount" only where a final count was sent: not for a chat
stream without include_usage, nor after an error or a non-streaming abort). `incremental` is
whether the stream carried deltas (a non-streaming response is never incremental);
`stream_interval` is the request's effective one.

The ASGI edge of one generation: bytes straight to the server, and the client's leaving
reported to the request's control, which aborts it when SGLang would (sim.engine).

The simulated SGLang server's token-carrying endpoints, /generate and /v1/chat/completions:
each request validated as SGLang 0.5.23 validates it (same status, same error body), admitted,
planned (or, continuing a cut completion, sim.completion), and answered by a streaming or one-shot
`GenerationResponse`; and /abort_request, which ends requests in flight (sim.engine).

The simulated SGLang server's endpoints that carry no tokens: health, model and server info,
the model list, /flush_cache and the root, plus the sim's own /sim/stats. They go through
Starlette's routing; the generation routes and /abort_request do not (see `sim.server`).

One simulated SGLang server as an ASGI app: the model tables and capacity its endpoints share,
and the dispatch between the generation endpoints (`sim.server`) and the info,
health and stats endpoints (`sim.server`).

Running a simulated server in the foreground: uvicorn, the start line, and --die-after.
"""
from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from genfleet.sim.capacity import Capacity, PrefixCache
from genfleet.sim.completion import CompletionPlan, Cut, CutCompletions, ReasoningFormat, reasoning_format
from genfleet.sim.engine import Engine, Frames, Generation, InFlight, RequestControl, Served
from genfleet.sim.faults import FaultInjector, FaultKind
from genfleet.sim.requests import (
    BadRequest,
    ChatRequest,
    ChatTemplate,
    GenerateRequest,
    InvalidRequest,
    SchemaError,
    parse_chat_request,
    parse_generate_request,
    verify_sampling,
)
from genfleet.sim.settings import SimSettings
from genfleet.sim.vocab import SimVocab
from genfleet.sim.wire import (
    DONE,
    INTERNAL_ERROR_TYPE,
    SSE_MEDIA_TYPE,
    ChatFrames,
    ChatOptions,
    ChunkEncoder,
    dumps,
    invalid_request_chunk,
    message_error_body,
    openai_error_body,
    schema_error_body,
)


class CompletionLog:
    """Appends lines to a file, flushed per line so a reader (or a killed server) loses none."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("a", encoding="utf-8", buffering=1 << 16)

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def served_record(
    head: dict[str, Any],
    plan: CompletionPlan,
    frames: Frames,
    served: Served,
    *,
    stream: bool,
    stream_interval: int,
    incremental: bool,
) -> dict[str, Any]:
    """The line of one served request: `head` (rid, api, continues, prompt), then what was sent."""
    return {
        **head,
        "output_ids": plan.output_ids[: served.generated],
        **frames.streamed(served.generated),
        "finish_reason": served.finish_reason,
        "completion_tokens": min(served.generated, len(plan.output_ids)),
        "stream": stream,
        "stream_interval": stream_interval,
        "incremental": incremental,
        "faults": list(served.faults),
    }


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


GENERATE_METHODS = ("POST", "PUT")
CHAT_METHODS = ("POST",)
ABORT_METHODS = ("POST",)
JSON_MEDIA_TYPE = "application/json"


class GenerationEndpoints:
    """/generate and /v1/chat/completions over one engine, one capacity and one fault stream.

    Both APIs share admission (context length, duplicate rid), the per-request fault draws and
    the completion log, so a request costs the same draws whichever API it came through."""

    def __init__(
        self,
        settings: SimSettings,
        *,
        vocab: SimVocab,
        reasoning_format: ReasoningFormat,
        capacity: Capacity,
        log: CompletionLog | None,
        prefix_cache: PrefixCache | None = None,
    ) -> None:
        self.settings = settings
        self.vocab = vocab
        self.reasoning_format = reasoning_format
        self.encoder = ChunkEncoder(vocab)
        self.chat_template = ChatTemplate(settings.tokenizer_dir)
        self.capacity = capacity
        self.engine = Engine(capacity, tick=settings.tick, prefix_cache=prefix_cache)
        self.faults = FaultInjector(settings.faults)
        self.log = log
        self.in_flight = InFlight()
        self.cuts = CutCompletions()

    # -- /generate ----------------------------------------------------------------------------

    async def generate(self, scope: Scope, receive: Receive) -> ASGIApp:
        body = await _json_body(scope, receive, GENERATE_METHODS)
        if isinstance(body, Response):
            return body
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
        prompt_ids = prompt if isinstance(prompt, list) else self.vocab.encode(prompt)
        rid = self._admit(len(prompt_ids), request.rid, request.sampling)
        cut = self.cuts.find(prompt) if isinstance(prompt, list) else None
        if cut is None:
            plan = self.settings.plan(prompt, vocab=self.vocab, seed=request.sampling_seed,
                                      max_new_tokens=request.max_new_tokens)
        else:
            plan = self.settings.plan_cut_continuation(cut, vocab=self.vocab, max_new_tokens=request.max_new_tokens)
        frames = self.encoder.frames(
            plan,
            rid=rid,
            prompt_tokens=len(prompt_ids),
            skip_special_tokens=request.skip_special_tokens,
            incremental=self.settings.incremental,
            error_format=self.settings.faults.error_format,
            weight_version=self.settings.weight_version,
        )
        prompt_field = {"input_ids": prompt} if isinstance(prompt, list) else {"input_text": prompt}
        log_head = {"rid": rid, "api": "generate", **({"continues": cut.rid} if cut else {}), **prompt_field}
        generation = self._generation(
            plan, frames, prompt_ids, request.stream, request.stream_interval, log_head=log_head, continues=cut,
            max_new_tokens=request.max_new_tokens,
        )
        return generation, rid

    def _invalid(self, message: str, *, streaming: bool) -> Response:
        if streaming:  # SGLang validates inside the stream, after a 200 went out
            chunk = invalid_request_chunk(message, self.settings.faults.error_format)
            return Response(chunk + DONE, 200, media_type=SSE_MEDIA_TYPE)
        return Response(message_error_body(message), 400, media_type=JSON_MEDIA_TYPE)

    # -- /v1/chat/completions -----------------------------------------------------------------

    async def chat(self, scope: Scope, receive: Receive) -> ASGIApp:
        body = await _json_body(scope, receive, CHAT_METHODS)
        if isinstance(body, Response):
            return body
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
        if (prompt_tokens < settings.context_length and request.max_tokens is not None
                and request.max_tokens + prompt_tokens > settings.context_length):
            # As SGLang 0.5.23 `_validate_one_request`, after its prompt-length check (`_admit`); the
            # sim's /generate does not check this (see `_admit`).
            raise InvalidRequest(
                f"Requested token count exceeds the model's maximum context length of {settings.context_length} "
                f"tokens. You requested a total of {request.max_tokens + prompt_tokens} tokens: {prompt_tokens} "
                f"tokens from the input messages and {request.max_tokens} tokens for the completion. Please reduce "
                "the number of tokens in the input messages or the completion to fit within the limit."
            )
        rid = self._admit(prompt_tokens, request.rid, request.sampling, prefix="chatcmpl-")
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
            cache_report=settings.enable_cache_report,
            weight_version=settings.weight_version,
        )
        table = self.encoder.text_table(skip_special_tokens=options.skip_special_tokens)
        frames = ChatFrames(plan, table=table, options=options)
        log_head = {"rid": rid, "api": "chat", "input_ids": prompt_ids}
        return self._generation(plan, frames, prompt_ids, request.stream, None, log_head=log_head,
                                max_new_tokens=max_new_tokens), rid

    # -- shared by both APIs ------------------------------------------------------------------

    def _admit(self, prompt_tokens: int, rid: str | None, sampling: dict[str, Any], prefix: str = "") -> str:
        """Check the prompt fits, that the sampling params are valid and that the rid is free;
        returns the rid. The checks and words of sglang 0.5.23
        `managers/tokenizer_manager.py` (`_validate_one_request`, then `SamplingParams.verify`)."""
        context = self.settings.context_length
        if prompt_tokens >= context:
            raise InvalidRequest(
                f"The input ({prompt_tokens} tokens) is longer than the model's context length "
                f"({context} tokens)."
            )
        # SGLang 0.5.23 also refuses prompt + max_new_tokens over the context (`_validate_one_request`);
        # the sim does not (docs/sim-conformance.md): end-to-end tests give it a tiny --context-length
        # to make one prompt too long while the others, asking the default 10,240 tokens, are served.
        verify_sampling(sampling, len(self.vocab.pieces))
        rid = rid if rid is not None else prefix + uuid.uuid4().hex
        if rid in self.in_flight:
            raise InvalidRequest(f"Duplicate request ID detected: {rid}")
        return rid

    def _generation(
        self,
        plan: CompletionPlan,
        frames: Frames,
        prompt_ids: list[int],
        stream: bool,
        stream_interval: int | None,
        *,
        log_head: dict[str, Any],
        max_new_tokens: int,
        continues: Cut | None = None,
    ) -> Generation:
        interval = self.settings.effective_stream_interval(stream_interval)
        on_served = None
        if self.log is not None:
            log, incremental = self.log, self.settings.incremental and stream

            def on_served(served: Served) -> None:
                log.write(served_record(log_head, plan, frames, served, stream=stream, stream_interval=interval,
                                        incremental=incremental))

        return Generation(
            plan=plan,
            frames=frames,
            prompt_tokens=len(prompt_ids),
            stream=stream,
            stream_interval=interval,
            fault=self.faults.draw(),  # one draw per admitted request, in arrival order
            steps=self.settings.steps,
            prompt_ids=prompt_ids,
            max_new_tokens=max_new_tokens,
            corruption=self.faults.draw_corruption(),  # also one per admitted request
            on_served=on_served,
            on_cut=self._cut_recorder(plan, prompt_ids, log_head["rid"], continues),
        )

    def _cut_recorder(
        self, plan: CompletionPlan, prompt_ids: list[int], rid: str, continues: Cut | None
    ) -> Callable[[int], None]:
        """Remembers the completion as cut when its client got part of it (sim.completion)."""
        offset = continues.generated if continues is not None else 0

        def on_cut(got: int) -> None:
            if got <= 0 or (plan.stopped and got >= plan.completion_tokens):
                return  # nothing to continue from, or nothing left to continue
            cut = Cut(rid, plan.rng_seed, plan.opening, offset + got)
            self.cuts.remember(prompt_ids, plan.output_ids[:got], cut)

        return on_cut

    def _respond(self, generation: Generation, rid: str) -> ASGIApp:
        control = RequestControl(
            rid, stream=generation.stream, capacity=self.capacity,
            disconnect_abort_s=self.settings.disconnect_abort_s,
            on_served=generation.on_served, on_cut=generation.on_cut,
        )
        self.in_flight.add(control)
        return GenerationResponse(self.engine, generation, control, on_done=lambda: self.in_flight.remove(control))

    # -- /abort_request -----------------------------------------------------------------------

    async def abort_request(self, scope: Scope, receive: Receive) -> ASGIApp:
        """`{"rid": ..., "abort_all": false}`: 200 with an empty body, whether or not anything was
        aborted (sglang 0.5.23 `entrypoints/http_server.py` `abort_request`; sim.engine)."""
        body = await _json_body(scope, receive, ABORT_METHODS)
        if isinstance(body, Response):
            return body
        fields = body if isinstance(body, dict) else {}
        rid, abort_all = fields.get("rid"), fields.get("abort_all", False)
        if not isinstance(body, dict) or not (rid is None or isinstance(rid, str)) or not isinstance(abort_all, bool):
            return _bad_request('expected an AbortReq: {"rid": string, "abort_all": boolean}')
        self.in_flight.abort_request(rid, abort_all)
        return Response(status_code=200)


async def _json_body(scope: Scope, receive: Receive, methods: tuple[str, ...]) -> Any:
    """The request's JSON body, or the 405 / 400 response that refuses it."""
    if scope["method"] not in methods:
        return PlainTextResponse("Method Not Allowed", 405, headers={"allow": ", ".join(methods)})
    try:
        return json.loads(await read_body(receive))
    except ValueError as error:
        return _bad_request(f"invalid JSON body: {error}")


def _bad_request(message: str) -> Response:
    """FastAPI's validation errors, which SGLang turns into 400s."""
    body = {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400}
    return Response(dumps(body), 400, media_type=JSON_MEDIA_TYPE)


class InfoEndpoints:
    """What a client or a load balancer asks a server about itself, answered as SGLang 0.5.23 does."""

    def __init__(
        self,
        settings: SimSettings,
        *,
        reasoning_parser: str,
        capacity: Capacity,
        is_shutting_down: Callable[[], bool],
        prefix_cache: PrefixCache | None = None,
    ) -> None:
        self.settings = settings
        self.reasoning_parser = reasoning_parser
        self.capacity = capacity
        self.prefix_cache = prefix_cache if prefix_cache is not None else PrefixCache(0)
        self._flush_pending = False
        self.is_shutting_down = is_shutting_down
        self._created = int(time.time())

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/health", self.health),
                Route("/health_generate", self.health),
                Route("/model_info", self.model_info),
                Route("/get_model_info", self.model_info),
                Route("/server_info", self.server_info),
                Route("/v1/loads", self.loads),
                Route("/get_server_info", self.server_info),
                Route("/v1/models", self.models),
                Route("/flush_cache", self.flush_cache, methods=["GET", "POST"]),
                Route("/", self.root),
                Route("/sim/stats", self.stats),
                Route("/sim/stats/reset", self.reset_stats, methods=["POST"]),
            ]
        )

    async def health(self, request: Request) -> Response:
        return Response(status_code=503 if self.is_shutting_down() else 200)

    async def model_info(self, request: Request) -> Response:
        path = str(self.settings.tokenizer_dir)
        return JSONResponse(
            {
                "model_path": path,
                "served_model_name": path,
                "tokenizer_path": path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": self.settings.weight_version,
                "load_format": "auto",
                "reasoning_parser": self.reasoning_parser,
                "tool_call_parser": None,
                "disaggregation_mode": "null",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "sim",
                "architectures": ["SimForCausalLM"],
            }
        )

    async def loads(self, request: Request) -> Response:
        """`/v1/loads` (sglang 0.5.23 `entrypoints/v1_loads.py`), one data-parallel rank, with the
        fields a client steers by. With `--max-total-tokens` the KV cache is that many tokens and
        `token_usage` the share the running requests hold (sim.capacity); without it, the cache is
        the `--max-running` slots and `token_usage` the share of them running. Nothing is retracted.
        `gen_throughput` is the decode speed now (SGLang's is the mean over its last log interval)."""
        if not self.settings.loads:
            return JSONResponse({"detail": "Not Found"}, 404)
        capacity = self.capacity
        running, limit, total = capacity.running, capacity.settings.max_running, capacity.settings.max_total_tokens
        usage = capacity.kv_tokens() / total if total else running / limit if limit else 0.0
        load = {
            "dp_rank": 0, "timestamp": time.time(), "num_running_reqs": running,
            "num_waiting_reqs": capacity.waiting, "max_running_requests": limit,
            "max_total_num_tokens": total, "token_usage": round(usage, 4),
            "gen_throughput": round(capacity.decode_rate() * running, 2),
            "queues": {"waiting": capacity.waiting, "grammar": 0, "paused": 0, "retracted": 0, "prealloc_ready": 0},
        }
        return JSONResponse({"timestamp": time.time(), "version": "sim", "accelerator": None, "num_accelerators": 1,
                             "loads": [load]})

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
                "reasoning_parser": self.reasoning_parser,
                "random_seed": settings.seed,
                "page_size": settings.capacity.page_size,
                "disable_radix_cache": not settings.capacity.prefix_cache_tokens,
                "enable_cache_report": settings.enable_cache_report,
                # The launch's --revision (SGLang's default: null, sglang 0.5.23
                # `arg_groups/fields/model.py`) and --weight-version (`arg_groups/fields/serving.py`).
                "revision": None,
                "weight_version": settings.weight_version,
                "sim": {
                    "capacity": asdict(settings.capacity),
                    "lengths": asdict(settings.lengths),
                    "steps": asdict(settings.steps),
                    "faults": {**asdict(settings.faults), "error_format": settings.faults.error_format.value},
                    "loops": asdict(settings.loops),
                    "disconnect_abort_s": settings.disconnect_abort_s,
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
        """Empty the prefix cache, only while no request runs or waits; `?timeout=S` waits up to S
        seconds for that (sglang 0.5.23 `entrypoints/http_server.py` `flush_cache`,
        `managers/scheduler_components/flush_wrapper.py`, `Scheduler.flush_cache`)."""
        text = request.query_params.get("timeout", "0")
        try:
            timeout = float(text)
        except ValueError:
            timeout = -1.0
        if not timeout >= 0:  # FastAPI's Query(0.0, ge=0.0); SGLang answers its validation errors 400
            message = f"timeout: {text!r} is not a number >= 0"
            return JSONResponse({"object": "error", "message": message, "type": "Bad Request", "param": None,
                                 "code": 400}, 400)
        if self._flush_pending:
            return PlainTextResponse("Another flush_cache is already in progress.", 400)
        message = "Flush cache failed.\n"
        if timeout > 0 and not self._idle():
            self._flush_pending = True
            try:
                message = await self._wait_idle(timeout)
            finally:
                self._flush_pending = False
        if not self._idle():
            return PlainTextResponse(message, 400)
        self.prefix_cache.clear()
        return PlainTextResponse(
            "Cache flushed.\nPlease check backend logs for more details. (When there are running or "
            "waiting requests, the operation will not be performed.)\n"
        )

    def _idle(self) -> bool:
        return self.capacity.running == 0 and self.capacity.waiting == 0

    async def _wait_idle(self, timeout: float) -> str:
        """Poll until idle, as the scheduler checks a deferred flush each loop; the failure message."""
        deadline = time.monotonic() + timeout
        while not self._idle() and time.monotonic() < deadline:
            await asyncio.sleep(min(self.settings.tick, max(deadline - time.monotonic(), 0.0)))
        return "Timed out waiting for idle state."

    async def root(self, request: Request) -> Response:
        return PlainTextResponse("SGLang is running")

    async def stats(self, request: Request) -> Response:
        return JSONResponse(self._stats())

    async def reset_stats(self, request: Request) -> Response:
        self.capacity.reset_stats()
        return JSONResponse(self._stats())

    def _stats(self) -> dict[str, object]:
        """The capacity's counters since the last reset, and what the prefix cache holds now (and
        has evicted since the start: neither is reset)."""
        cache = self.prefix_cache
        return {**asdict(self.capacity.stats()), "prefix_cache_tokens": cache.tokens,
                "prefix_cache_evicted_tokens": cache.evicted_tokens}


GENERATE_PATH = "/generate"
CHAT_PATH = "/v1/chat/completions"
ABORT_PATH = "/abort_request"


class SimServer:
    """One simulated SGLang server as an ASGI app: model tables, capacity, faults and routes."""

    def __init__(self, settings: SimSettings) -> None:
        self.settings = settings
        self.vocab = SimVocab.from_tokenizer_dir(settings.tokenizer_dir)
        self.reasoning_format = reasoning_format(settings.reasoning_format)
        self.reasoning_format.check(self.vocab)  # fail at start, not on the first request
        self.capacity = Capacity(settings.capacity)
        self.prefix_cache = PrefixCache(settings.capacity.prefix_cache_tokens, settings.capacity.page_size)
        self.log = CompletionLog(settings.log_completions) if settings.log_completions else None
        self.shutting_down = False  # set by the runner on SIGTERM; /health answers 503 from then on
        self.generation = GenerationEndpoints(
            settings, vocab=self.vocab, reasoning_format=self.reasoning_format, capacity=self.capacity, log=self.log,
            prefix_cache=self.prefix_cache,
        )
        self.info = InfoEndpoints(
            settings,
            reasoning_parser=self.reasoning_format.name,
            capacity=self.capacity,
            prefix_cache=self.prefix_cache,
            is_shutting_down=lambda: self.shutting_down,
        )
        self._routes = self.info.app()
        # /abort_request goes with them: it reaches the requests in flight that they hold.
        self._generation_routes = {
            GENERATE_PATH: self.generation.generate,
            CHAT_PATH: self.generation.chat,
            ABORT_PATH: self.generation.abort_request,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The generation routes carry every token, so they skip Starlette's routing and
        # middleware, which would otherwise wrap each chunk's `send` in two more coroutines.
        path = scope["path"] if scope["type"] == "http" else None
        endpoint = self._generation_routes.get(path) if path is not None else None
        if endpoint is not None:
            try:
                response = await endpoint(scope, receive)
            except ClientDisconnect:
                return  # gone before its request was read
            await response(scope, receive, send)
        else:
            await self._routes(scope, receive, send)


GRACEFUL_SHUTDOWN_S = 2  # stalled streams never end by themselves; uvicorn types it as whole seconds


def serve(settings: SimSettings) -> None:
    """Run a simulated server until interrupted."""
    sim = SimServer(settings)
    config = uvicorn.Config(
        sim,
        interface="asgi3",
        host=settings.host,
        port=settings.port,
        loop="auto",  # uvloop and httptools when installed
        http="auto",
        lifespan="off",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    try:
        _SimUvicorn(config, sim).run()
    finally:
        if sim.log is not None:
            sim.log.close()


class _SimUvicorn(uvicorn.Server):
    """uvicorn that flags the shutdown for /health, and can die on schedule."""

    def __init__(self, config: uvicorn.Config, sim: SimServer) -> None:
        super().__init__(config)
        self.sim = sim
        self._loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if not self.started:
            return
        self._loop = asyncio.get_running_loop()
        settings = self.sim.settings
        print(f"sim listening on {settings.url} ({settings.describe()})", flush=True)
        if settings.faults.die_after is not None:
            asyncio.get_running_loop().call_later(settings.faults.die_after, _die, settings.faults.die_after)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.sim.shutting_down = True
        if self._loop is not None:  # a signal handler: the loop runs the aborts, between its callbacks
            self._loop.call_soon_threadsafe(self.sim.generation.in_flight.abort_left)
        super().handle_exit(sig, frame)


def _die(after: float) -> None:
    print(f"sim: dying abruptly, as --die-after {after:g} asked", file=sys.stderr, flush=True)
    os._exit(1)  # no cleanup, no goodbye: a crashed host
