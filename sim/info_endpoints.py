"""The simulated SGLang server's endpoints that carry no tokens: health, model and server info,
the model list, /flush_cache and the root, plus the sim's own /sim/stats. They go through
Starlette's routing; the generation routes and /abort_request do not (see `sim.server`)."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import asdict

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from genfleet.sim.capacity import Capacity
from genfleet.sim.prefix_cache import PrefixCache
from genfleet.sim.settings import SimSettings


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
