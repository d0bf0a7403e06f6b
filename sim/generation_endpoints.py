"""The simulated SGLang server's token-carrying endpoints, /generate and /v1/chat/completions:
each request validated as SGLang 0.5.23 validates it (same status, same error body), admitted,
planned (or, continuing a cut completion, sim.continuation), and answered by a streaming or one-shot
`GenerationResponse`; and /abort_request, which ends requests in flight (sim.aborts)."""
from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope

from genfleet.sim.aborts import InFlight, RequestControl
from genfleet.sim.capacity import Capacity
from genfleet.sim.chat_request import ChatRequest, ChatTemplate, parse_chat_request
from genfleet.sim.chat_wire import INTERNAL_ERROR_TYPE, ChatFrames, ChatOptions, openai_error_body
from genfleet.sim.completion import CompletionPlan
from genfleet.sim.completion_log import CompletionLog, served_record
from genfleet.sim.continuation import Cut, CutCompletions
from genfleet.sim.engine import Engine, Frames, Generation, Served
from genfleet.sim.faults import FaultInjector, FaultKind
from genfleet.sim.generation_response import GenerationResponse, read_body
from genfleet.sim.prefix_cache import PrefixCache
from genfleet.sim.reasoning_formats import ReasoningFormat
from genfleet.sim.request import (
    BadRequest,
    GenerateRequest,
    InvalidRequest,
    SchemaError,
    parse_generate_request,
    verify_sampling,
)
from genfleet.sim.settings import SimSettings
from genfleet.sim.vocab import SimVocab
from genfleet.sim.wire import (
    DONE,
    SSE_MEDIA_TYPE,
    ChunkEncoder,
    dumps,
    invalid_request_chunk,
    message_error_body,
    schema_error_body,
)

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
        return self._generation(plan, frames, prompt_ids, request.stream, None, log_head=log_head), rid

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
            corruption=self.faults.draw_corruption(),  # also one per admitted request
            on_served=on_served,
            on_cut=self._cut_recorder(plan, prompt_ids, log_head["rid"], continues),
        )

    def _cut_recorder(
        self, plan: CompletionPlan, prompt_ids: list[int], rid: str, continues: Cut | None
    ) -> Callable[[int], None]:
        """Remembers the completion as cut when its client got part of it (sim.continuation)."""
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
        aborted (sglang 0.5.23 `entrypoints/http_server.py` `abort_request`; sim.aborts)."""
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
