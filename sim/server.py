"""One simulated SGLang server as an ASGI app: the model tables and capacity its endpoints share,
and the dispatch between the generation endpoints (`sim.generation_endpoints`) and the info,
health and stats endpoints (`sim.info_endpoints`)."""
from __future__ import annotations

from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from genfleet.sim.capacity import Capacity
from genfleet.sim.completion_log import CompletionLog
from genfleet.sim.generation_endpoints import GenerationEndpoints
from genfleet.sim.info_endpoints import InfoEndpoints
from genfleet.sim.prefix_cache import PrefixCache
from genfleet.sim.reasoning_formats import reasoning_format
from genfleet.sim.settings import SimSettings
from genfleet.sim.vocab import SimVocab

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
