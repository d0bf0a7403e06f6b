"""SGLang's server, behind the seam (`api.ServerApi`): the request bodies, SGLang's ways of saying no,
its streams assembled and checked chunk by chunk, and the server that ties them.

Every way SGLang says no, mapped once into genfleet's typed errors (`workers/errors.py`). Shapes,
from sglang 0.5.23 (`entrypoints/http_server.py`, `managers/tokenizer_manager.py`): an HTTP status
before the stream; `data: {"error": {...}}` mid-stream (0.5.23 sends message, type, code,
retryable; 0.5.2 only message); a final chunk whose `finish_reason.type` is "abort".

Request bodies: field names and defaults from sglang 0.5.23 `sampling/sampling_params.py`
(`/generate`'s `sampling_params`) and `entrypoints/openai/protocol.py` (`ChatCompletionRequest`).
SGLang rejects an unknown key inside `sampling_params` (HTTP 400), so only its own names are sent.

`/generate` streams (`StreamAssembler`): whether chunks are cumulative (the default: each carries the
whole text and ids so far) or deltas (`--incremental-streaming-output`) is a server setting, read once
per upstream from `/server_info` (`sglang_info.StreamMode`). Only where a server or router does not
say is the mode inferred, from the one fact every chunk carries in both modes:
`meta_info.completion_tokens`, the count of ids sent so far (0.5.23
`managers/scheduler_components/output_streamer.py`: `completion_tokens = len(output_ids_through_stop)`).
Once any id has arrived, a cumulative chunk carries exactly `completion_tokens` ids and a delta
carries `completion_tokens - assembled`; the two can only be equal before the first id, when both
modes read the same. So the first chunk that reports its count after an id has arrived decides,
final or not. 0.5.2 sent cumulative text with delta ids; it is told apart by a meta_info without
`num_retractions`.

Integrity: every chunk is checked against what came before (a cumulative chunk's text extends the
previous one; the ids add up to `completion_tokens`), and a stream whose assembled ids differ from
its final `completion_tokens` raises `IntegrityError`: a dropped, duplicated or reordered chunk is
never written as a record.

`/v1/chat/completions` streams (`ChatStreamAssembler`): the server has already split reasoning
(`delta.reasoning_content`) from content (`delta.content`).

After each chunk the loop guard (`generation/loop_guard.StreamWatch`) sees what arrived; when it
says stop, the stream is closed and the server asked to drop the request. Streams go over
`transport.py`'s kept connections; the short requests (`sglang_info.py`'s pages, `/abort_request`)
over one httpx client.
"""
from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from genfleet.workers.errors import (
    IntegrityError,
    PermanentError,
    TransientError,
    UpstreamAborted,
)
from genfleet.workers.generation.loop_guard import StreamWatch
from genfleet.workers.servers.api import (
    Generation,
    GenerationRequest,
    LoadReading,
    ModelIdentity,
    ServerDescription,
)
from genfleet.workers.servers.sglang_info import LOADS_PATH, ServerInfo
from genfleet.workers.servers.streaming import (
    RETRYABLE_4XX,
    ChatStreamAssembler,
    HttpServerKind,
    error_from_chunk,
    loop_of,
    read_stream,
)

log = logging.getLogger(__name__)

def abort_error(finish_reason: dict[str, Any]) -> TransientError | PermanentError:
    message = finish_reason.get("message") or "aborted"
    status = finish_reason.get("status_code")
    if isinstance(status, int) and 400 <= status < 500 and status not in RETRYABLE_4XX:
        return PermanentError(f"upstream aborted ({status}): {message}")
    return UpstreamAborted(f"upstream aborted ({status}): {message}")


def generate_body(request: GenerationRequest) -> dict[str, Any]:
    """`/generate`, streamed: the prompt's token ids (or its text when there are none).

    `require_reasoning`: the output starts inside the reasoning (the template opened it). SGLang
    counts `meta_info.reasoning_tokens` (up to and including the end marker) only for a request
    that says so (0.5.23 `managers/io_struct.py` `GenerateReqInput.require_reasoning`, read by
    `scheduler_components/batch_result_processor.py::_maybe_update_reasoning_tokens`; its chat
    endpoint sets it itself): without it every /generate record counted 0 reasoning tokens. The
    count needs the server's `--reasoning-parser` (its end marker's ids); without one it stays 0."""
    sampling = {
        **request.sampling,
        "max_new_tokens": request.max_new_tokens,
        # Keep </think> in the text: with it skipped, reasoning silently merges into content.
        "skip_special_tokens": request.skip_special_tokens,
        # Per request: SGLang's server default of 1 makes cumulative streams quadratic in bytes.
        "stream_interval": request.stream_interval,
    }
    prompt = {"input_ids": request.input_ids} if request.input_ids is not None else {"text": request.text}
    body = {**prompt, "stream": True, "sampling_params": sampling}
    if request.starts_in_reasoning:
        body["require_reasoning"] = True
    return body


def chat_body(request: GenerationRequest) -> dict[str, Any]:
    """`/v1/chat/completions`: the server templates the messages and splits reasoning itself."""
    sampling = dict(request.sampling)
    if "sampling_seed" in sampling:
        sampling["seed"] = sampling.pop("sampling_seed")  # the OpenAI API's name for it
    return {
        "model": "default", "messages": request.messages, "max_tokens": request.max_new_tokens, **sampling,
        "chat_template_kwargs": dict(request.chat_template_kwargs or {}), "separate_reasoning": True,
    }


@dataclass
class StreamAssembler:
    # What the server said; None: infer it from the chunks.
    incremental: bool | None = None
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    finish_reason: dict[str, Any] | None = None
    # Decided by the server's word or by the first chunk after an id has arrived; None until then.
    ids_cumulative: bool | None = None
    chunks: int = 0

    def __post_init__(self) -> None:
        if self.incremental is not None:
            self.ids_cumulative = not self.incremental

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def feed(self, chunk: dict[str, Any]) -> None:
        """Add one decoded `data:` chunk; raises a typed error for error chunks, aborts and any chunk
        that contradicts the stream so far."""
        if "error" in chunk:
            raise error_from_chunk(chunk["error"])
        self.chunks += 1
        meta = chunk.get("meta_info") or {}
        finish_reason = meta.get("finish_reason")
        if finish_reason is not None and finish_reason.get("type") == "abort":
            self.finish_reason = finish_reason
            raise abort_error(finish_reason)
        ids = chunk.get("output_ids") or []
        text = chunk.get("text") or ""
        sent = meta.get("completion_tokens")
        if not isinstance(sent, int):
            sent = None
        if self.ids_cumulative is None and self.output_ids:
            self.ids_cumulative = self._infer_cumulative(len(ids), sent)
        if self.ids_cumulative is None or self.ids_cumulative:
            # json.loads gave a fresh list: keep it, no copy. Before any id, both modes read the same.
            self._check_extends(ids, text)
            self.output_ids = ids
            self.text = text
        else:
            self.output_ids.extend(ids)
            # 0.5.23 streams text the way it streams ids; 0.5.2 always streamed cumulative text.
            if "num_retractions" in meta or self.incremental:
                self.text += text
            else:
                self._check_text_extends(text)
                self.text = text
        if sent is not None and len(self.output_ids) != sent:
            raise IntegrityError(self._describe(f"{len(self.output_ids)} ids assembled but completion_tokens "
                                                f"says {sent}"))
        self.meta.update(meta)
        if finish_reason is not None:
            if sent is None:
                raise IntegrityError(self._describe("the final chunk reports no completion_tokens"))
            self.finish_reason = finish_reason

    def _infer_cumulative(self, count: int, sent: int | None) -> bool | None:
        if sent is None:
            return None  # decided by a later chunk that carries its count
        have = len(self.output_ids)
        if count == sent:
            return True  # a delta would carry sent - have < sent ids
        if count == sent - have:
            return False
        raise IntegrityError(self._describe(f"a chunk of {count} ids after {have} with completion_tokens {sent} "
                                            "is neither cumulative nor a delta"))

    def _check_extends(self, ids: list[int], text: str) -> None:
        # The ids are checked at the boundary only (the count is checked on every chunk): a full
        # comparison would make a cumulative stream cost O(n) per chunk on top of its parse.
        have = len(self.output_ids)
        if have and (len(ids) < have or ids[have - 1] != self.output_ids[-1]):
            raise IntegrityError(self._describe("a cumulative chunk's ids do not extend the previous chunk's"))
        self._check_text_extends(text)

    def _check_text_extends(self, text: str) -> None:
        if not text.startswith(self.text):
            raise IntegrityError(self._describe("a cumulative chunk's text does not extend the previous chunk's"))

    def _describe(self, problem: str) -> str:
        mode = {None: "mode not yet known", True: "cumulative", False: "incremental"}[self.ids_cumulative]
        said = "" if self.incremental is None else " (as the server reports)"
        return f"stream integrity: {problem} at chunk {self.chunks} ({mode}{said})"


class SglangServer(HttpServerKind):
    """SGLang's server kind (`api.ServerApi`)."""

    load_source = LOADS_PATH

    def __init__(self, *, max_connections: int, connect_timeout_s: float, stall_timeout_s: float) -> None:
        super().__init__(max_connections=max_connections, connect_timeout_s=connect_timeout_s,
                         stall_timeout_s=stall_timeout_s)
        self.info = ServerInfo(self.http)

    def forget(self, upstream: str) -> None:
        self.info.forget(upstream)

    def model_identity(self, upstream: str) -> ModelIdentity:
        return self.info.model_identity(upstream)

    def describe(self, upstream: str) -> ServerDescription:
        return self.info.describe(upstream, timeout_s=5.0)

    def read_load(self, upstream: str) -> LoadReading:
        return self.info.read_load(upstream, timeout_s=5.0)


    def generate(self, upstream: str, request: GenerationRequest, *, deadline: float,
                 should_stop: Callable[[], bool] = lambda: False, watch: StreamWatch | None = None) -> Generation:
        if request.chat:
            return self._chat(upstream, request, deadline, should_stop, watch)
        return self._generate(upstream, request, deadline, should_stop, watch)

    def _generate(self, upstream: str, request: GenerationRequest, deadline: float,
                  should_stop: Callable[[], bool], watch: StreamWatch | None) -> Generation:
        """Native `/generate` streaming, cumulative or incremental as the server reports it."""
        body = {"rid": new_rid(), **generate_body(request)}
        mode = self.info.stream_mode(upstream)
        started = time.monotonic()
        assembler = StreamAssembler(incremental=mode.incremental)
        cut = (lambda: watch.ids_arrived(assembler.output_ids)) if watch is not None else None
        first_token_s = read_stream(self.streams, self.stall_timeout_s, upstream, "/generate", body, assembler,
                                    started, deadline, should_stop,
                                    has_tokens=lambda: bool(assembler.output_ids), cut=cut)
        if cut is not None and not assembler.finished:
            self.abort(upstream, body["rid"])
            assembler.finish_reason = {"type": "loop"}
        meta = assembler.meta
        finish = assembler.finish_reason or {}
        return Generation(
            finish=str(finish.get("type") or "stop"), matched_stop=finish.get("matched"),
            granted_tokens=_granted(finish),
            prompt_tokens=int(meta.get("prompt_tokens") or 0),
            completion_tokens=int(meta.get("completion_tokens") or 0),
            reasoning_tokens=int(meta.get("reasoning_tokens") or 0),
            cached_tokens=int(meta.get("cached_tokens") or 0),
            first_token_s=first_token_s, duration_s=time.monotonic() - started,
            e2e_latency=meta.get("e2e_latency"), text=assembler.text, output_ids=assembler.output_ids,
            request_id=body["rid"], loop=loop_of(watch),
        )

    def _chat(self, upstream: str, request: GenerationRequest, deadline: float,
              should_stop: Callable[[], bool], watch: StreamWatch | None) -> Generation:
        """`/v1/chat/completions` streaming; asks for usage in the last chunk. A stream the loop
        guard cut has no usage chunk: its counts are then unknown (0)."""
        started = time.monotonic()
        assembler = ChatStreamAssembler()
        body = {"rid": new_rid(), **chat_body(request), "stream": True, "stream_options": {"include_usage": True}}
        cut = (lambda: watch.text_arrived(assembler.reasoning, assembler.content)) if watch is not None else None
        first_token_s = read_stream(self.streams, self.stall_timeout_s, upstream, "/v1/chat/completions", body,
                                    assembler, started, deadline, should_stop,
                                    has_tokens=lambda: assembler.has_tokens, cut=cut)
        if cut is not None and not assembler.finished:
            self.abort(upstream, body["rid"])
            assembler.finish_reason = {"type": "loop"}
        else:
            assembler.verify()
        usage = assembler.usage
        details = usage.get("completion_tokens_details") or {}
        prompt_details = usage.get("prompt_tokens_details") or {}
        finish = assembler.finish_reason or {}
        return Generation(
            finish=str(finish.get("type") or "stop"), matched_stop=finish.get("matched"),
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            reasoning_tokens=int(usage.get("reasoning_tokens") or details.get("reasoning_tokens") or 0),
            cached_tokens=int(prompt_details.get("cached_tokens") or 0),
            first_token_s=first_token_s, duration_s=time.monotonic() - started,
            reasoning=assembler.reasoning, content=assembler.content, request_id=body["rid"],
            loop=loop_of(watch),
        )

    def abort(self, upstream: str, request_id: str) -> None:
        """Ask the server to drop a request whose stream we closed. SGLang 0.5.23 itself drops it at
        once when the stream's connection closes (`managers/tokenizer_manager.py` `generate_request`
        releases it on the cancelled generator, `_release_req_states_on_failure`; the 2 s
        `create_abort_task` of `entrypoints/http_server.py` is a fallback): measured on the real
        server, its running count was 0 within 1 s (tests/sglang_real/test_loop_guard_on_sglang.py).
        The explicit abort still frees the slot where something between us and the scheduler (a
        router, a proxy) keeps its own connection open. `POST /abort_request {"rid": ...}` (0.5.23
        `http_server.py::abort_request`, `AbortReq`) answers 200 for a finished or unknown rid too.
        Best effort: the disconnect frees it anyway."""
        try:
            response = self.http.post(f"{upstream}/abort_request", json={"rid": request_id}, timeout=5.0)
            if response.status_code != 200:
                log.warning("%s/abort_request for %s answered %d", upstream, request_id, response.status_code)
        except httpx.HTTPError as error:
            log.warning("%s/abort_request for %s failed: %s", upstream, request_id, error)

def _granted(finish_reason: dict[str, Any]) -> int | None:
    """SGLang lowers a request's budget to what its context (and KV pool) leaves, `context - 2 -
    input` at most (0.5.23 `managers/scheduler.py::init_req_max_new_tokens`), and reports the
    budget it kept as `finish_reason.length` on a cut."""
    granted = finish_reason.get("length") if finish_reason.get("type") == "length" else None
    return granted if isinstance(granted, int) and not isinstance(granted, bool) else None


def new_rid() -> str:
    """SGLang's own default is uuid4().hex (io_struct.py); ours is the same shape, made here so the
    worker knows it (logs, and `/abort_request` to free a slot)."""
    return uuid.uuid4().hex


