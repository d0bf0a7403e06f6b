"""The SGLang client: request bodies, SGLang's ways of saying no, the streams assembled and checked
chunk by chunk, the server's info, and the client that ties them.

Every way SGLang says no, mapped once into genfleet's typed errors (`workers/errors.py`), the way
httpx maps its transport's exceptions at one boundary (`httpx/_transports/default.py`).

Shapes, from sglang 0.5.23 (`entrypoints/http_server.py`, `managers/tokenizer_manager.py`):
an HTTP status before the stream; `data: {"error": {...}}` mid-stream (0.5.23 sends message, type,
code, retryable; 0.5.2 only message); a final chunk whose `finish_reason.type` is "abort".

The request bodies genfleet sends to SGLang, built from a task's payload.

Field names and defaults: sglang 0.5.23 `sampling/sampling_params.py` (`/generate`'s
`sampling_params`) and `entrypoints/openai/protocol.py` (`ChatCompletionRequest`). SGLang rejects an
unknown key inside `sampling_params` (HTTP 400), so only its own names are sent.

Assembles SGLang `/generate` stream chunks into one generation and proves it adds up.

Whether chunks are cumulative (the default: each carries the whole text and ids so far) or deltas
(`--incremental-streaming-output`) is a server setting, read once per upstream from `/server_info`
(`StreamMode`). Only where a server or router does not say is the mode inferred, from the one fact
every chunk carries in both modes: `meta_info.completion_tokens`, the count of ids sent so far
(sglang 0.5.23 `managers/scheduler_components/output_streamer.py`: `completion_tokens =
len(output_ids_through_stop)`). Once any id has arrived, a cumulative chunk carries exactly
`completion_tokens` ids and a delta carries `completion_tokens - assembled`; the two can only be
equal before the first id, when both modes read the same. So the first chunk that reports its count
after an id has arrived decides, final or not.
0.5.2 sent cumulative text with delta ids; it is told apart by a meta_info without `num_retractions`.

Integrity: every chunk is checked against what came before (a cumulative chunk's text extends the
previous one; the ids add up to `completion_tokens`), and a stream whose assembled ids differ from
its final `completion_tokens` raises `IntegrityError`: a dropped, duplicated or reordered chunk is
never written as a record.

Assembles an OpenAI-style `/v1/chat/completions` stream from SGLang, where the server has
already split reasoning (`delta.reasoning_content`) from content (`delta.content`).

Watches a stream as it arrives, for the loop guard: feeds each chunk's new token ids (or, over
the chat API, its new characters) to a `LoopDetector` and says when the stream should stop.

`abort` stops at the first loop found; `flag` only remembers it (the completion runs to its end and
is marked). The client then closes the stream and asks the server to drop the request.

What each upstream says about itself, asked once and cached: its stream mode and the revision it
was launched with (`/server_info`), and its served model's name and weight version (`/model_info`).
Forgotten when the host's breaker closes again: a host that comes back may have restarted with other
settings, or another model.

What a server does not say stays None, never guessed. Each page is asked once per upstream, not per
record: a weight update on a live server (SGLang 0.5.23 `/update_weight_version`, or
`/update_weights_from_disk` with a `weight_version`) is seen only after the host is forgotten.

Streams one generation from SGLang: native `/generate` (the default) or `/v1/chat/completions`
with server-side reasoning split. Streams go over `stream_http.py`'s kept connections; the short
requests (/server_info, /abort_request) over one httpx client. Every wire failure leaves as one of
the typed errors of `workers/errors.py` (mapped at the top of this module).
"""
from __future__ import annotations

import http.client
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import httpx

from genfleet.common.records import TaskPayload
from genfleet.workers.errors import (
    DeadlineExceeded,
    IntegrityError,
    PermanentError,
    SendFailed,
    ShutdownRequested,
    StreamCut,
    StreamStalled,
    TransientError,
    UpstreamAborted,
)
from genfleet.workers.generation.loop_guard import Loop, LoopDetector, LoopThresholds
from genfleet.workers.generation.stream_http import StreamConnections, data_payloads

# 408 and 429 are "try later"; every other 4xx means the request itself is wrong.
RETRYABLE_4XX = {408, 429}

# What SGLang reports as a bad request (a ValueError in the server): the same request fails again.
INVALID_REQUEST = re.compile(
    r"context length|maximum context|Either text, input_ids|Duplicate request ID|unknown field|"
    r"invalid|expected one of|not supported", re.I)


def error_from_chunk(error: Any) -> TransientError | PermanentError:
    """`data: {"error": ...}`: 0.5.23 says {message,type,code,retryable}; 0.5.2 only {message}."""
    if not isinstance(error, dict):
        error = {"message": str(error)}
    message = str(error.get("message", error))
    retryable = error.get("retryable")
    code = error.get("code")
    if retryable is None and isinstance(code, int):
        retryable = code >= 500 or code in RETRYABLE_4XX
    if retryable is None:
        retryable = not INVALID_REQUEST.search(message)
    return (TransientError if retryable else PermanentError)(f"upstream error: {message}")


def abort_error(finish_reason: dict[str, Any]) -> TransientError | PermanentError:
    message = finish_reason.get("message") or "aborted"
    status = finish_reason.get("status_code")
    if isinstance(status, int) and 400 <= status < 500 and status not in RETRYABLE_4XX:
        return PermanentError(f"upstream aborted ({status}): {message}")
    return UpstreamAborted(f"upstream aborted ({status}): {message}")


def http_error(status: int, url: str, body: bytes) -> TransientError | PermanentError:
    """A refused request (any status but 200, before the stream), by its status and body."""
    message = f"HTTP {status} from {url}: {_error_message(body)}"
    if status >= 500 or status in RETRYABLE_4XX:
        return TransientError(message)
    return PermanentError(message)


def _error_message(body: bytes) -> str:
    try:
        parsed = json.loads(body)
    except ValueError:
        return body[:500].decode("utf-8", "replace")
    error = parsed.get("error", parsed) if isinstance(parsed, dict) else parsed
    if isinstance(error, dict):
        return str(error.get("message", error))
    return str(error)


@contextmanager
def transport_errors(url: str, stall_timeout_s: float,
                     should_stop: Callable[[], bool] = lambda: False) -> Iterator[None]:
    """The transport's exceptions while talking to `url` (`stream_http.py`: socket and TLS errors,
    `http.client`'s protocol errors), as transient errors that name it; as ShutdownRequested when
    the worker is stopping (its shutdown cut the stream on purpose). A timeout once the request
    is out is the stall timeout (the socket's read timeout); one before it, the connect timeout."""
    try:
        yield
    except SendFailed as failed:
        if should_stop():
            raise ShutdownRequested() from None
        error = failed.cause
        if isinstance(error, TimeoutError):
            raise TransientError(f"timeout talking to {url}: could not connect and send") from None
        raise TransientError(f"transport error from {url}: {type(error).__name__}: {error}") from None
    except (OSError, http.client.HTTPException) as error:
        if should_stop():
            raise ShutdownRequested() from None
        if isinstance(error, TimeoutError):
            raise StreamStalled(f"no data from {url} for {stall_timeout_s:g} s") from None
        raise TransientError(f"transport error from {url}: {type(error).__name__}: {error}") from None


def generate_body(payload: TaskPayload, input_ids: list[int] | None, *, skip_special_tokens: bool,
                  stream_interval: int, require_reasoning: bool = False) -> dict[str, Any]:
    """`/generate`, streamed: the producer's token ids (or the text when there are none).

    `require_reasoning`: the output starts inside the reasoning (the template opened it). SGLang
    counts `meta_info.reasoning_tokens` (up to and including the end marker) only for a request
    that says so (0.5.23 `managers/io_struct.py` `GenerateReqInput.require_reasoning`, read by
    `scheduler_components/batch_result_processor.py::_maybe_update_reasoning_tokens`; its chat
    endpoint sets it itself): without it every /generate record counted 0 reasoning tokens. The
    count needs the server's `--reasoning-parser` (its end marker's ids); without one it stays 0."""
    sampling = {
        **payload.sampling,
        "max_new_tokens": payload.max_new_tokens,
        # Keep </think> in the text: with it skipped, reasoning silently merges into content.
        "skip_special_tokens": skip_special_tokens,
        # Per request: SGLang's server default of 1 makes cumulative streams quadratic in bytes.
        "stream_interval": stream_interval,
    }
    prompt = {"input_ids": input_ids} if input_ids is not None else {"text": payload.text}
    body = {**prompt, "stream": True, "sampling_params": sampling}
    if require_reasoning:
        body["require_reasoning"] = True
    return body


def chat_body(payload: TaskPayload, messages: list[dict]) -> dict[str, Any]:
    """`/v1/chat/completions`: the server templates the messages and splits reasoning itself."""
    sampling = dict(payload.sampling)
    if "sampling_seed" in sampling:
        sampling["seed"] = sampling.pop("sampling_seed")  # the OpenAI API's name for it
    return {
        "model": "default", "messages": messages, "max_tokens": payload.max_new_tokens, **sampling,
        "chat_template_kwargs": payload.chat_template_kwargs, "separate_reasoning": True,
    }


@dataclass(frozen=True)
class StreamMode:
    """What a server said about its streaming (`/server_info`); `incremental=None`: it did not say."""

    incremental: bool | None = None
    stream_interval: int | None = None

    @classmethod
    def from_server_info(cls, info: Any) -> StreamMode:
        """sglang 0.5.23 `utils/common.py::build_server_info` returns `server_args.resolved_dict()`
        flat, so `incremental_streaming_output` and `stream_interval` are top-level keys."""
        if not isinstance(info, dict):
            return cls()
        incremental = info.get("incremental_streaming_output")
        interval = info.get("stream_interval")
        return cls(incremental if isinstance(incremental, bool) else None,
                   interval if isinstance(interval, int) and not isinstance(interval, bool) else None)


UNKNOWN = StreamMode()


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


# OpenAI finish reasons, mapped to SGLang's native finish types used in records.
FINISH_TYPES = {"stop": "stop", "tool_calls": "stop", "function_call": "stop", "length": "length",
                "abort": "abort", "content_filter": "abort"}


@dataclass
class ChatStreamAssembler:
    reasoning: str = ""
    content: str = ""
    usage: dict[str, Any] = field(default_factory=dict)
    finish_reason: dict[str, Any] | None = None
    chunks: int = 0
    # Chunks that carried text: SGLang sends none without at least one new token.
    text_chunks: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def has_tokens(self) -> bool:
        return bool(self.reasoning or self.content)

    def feed(self, chunk: dict[str, Any]) -> None:
        if "error" in chunk:
            raise error_from_chunk(chunk["error"])
        self.chunks += 1
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            reasoning, content = delta.get("reasoning_content") or "", delta.get("content") or ""
            self.reasoning += reasoning
            self.content += content
            self.text_chunks += bool(reasoning or content)
            reason = choice.get("finish_reason")
            if reason is not None:
                self.finish_reason = {"type": FINISH_TYPES.get(reason, reason), "matched": choice.get("matched_stop")}
                if self.finish_reason["type"] == "abort":
                    raise UpstreamAborted(f"upstream aborted the chat stream ({reason})")

    def verify(self) -> None:
        """What the chat stream lets us check, which is less than `/generate`: deltas carry text, not
        ids, and SGLang may split one step's text over a reasoning and a content chunk
        (0.5.23 `entrypoints/openai/serving_chat.py::_generate_stream_content`), so chunks do not
        count tokens. The usage chunk asked for with `stream_options.include_usage` must arrive
        (without it the record's counts would be zeros), and a stream that carried text cannot
        have generated zero tokens."""
        if not self.usage:
            raise IntegrityError("stream integrity: the chat stream ended without the usage chunk that "
                                 "stream_options.include_usage asks for")
        completion_tokens = self.usage.get("completion_tokens")
        if not isinstance(completion_tokens, int) or (self.text_chunks and completion_tokens < 1):
            raise IntegrityError(f"stream integrity: usage says {completion_tokens!r} completion tokens but "
                                 f"{self.text_chunks} chunks carried text")




class StreamWatch:
    def __init__(self, policy: str, thresholds: LoopThresholds, prefix: Sequence[int] | str = ()) -> None:
        if policy not in ("abort", "flag"):
            raise ValueError(f"no stream watch for loop guard {policy!r}")
        self.abort = policy == "abort"
        self.detector = LoopDetector(thresholds, prefix=prefix)
        self._ids_seen = 0
        self._reasoning_seen = 0
        self._content_seen = 0

    @property
    def loop(self) -> Loop | None:
        return self.detector.found

    def ids_arrived(self, ids: list[int]) -> bool:
        """`ids`: every id assembled so far (cumulative or not); True: stop reading now."""
        new = ids[self._ids_seen:]
        self._ids_seen = len(ids)
        if new:
            self.detector.extend(new)
        return self.abort and self.detector.found is not None

    def text_arrived(self, reasoning: str, content: str) -> bool:
        """The chat API's reasoning and content so far; fed as one stream of characters."""
        new = reasoning[self._reasoning_seen:] + content[self._content_seen:]
        self._reasoning_seen, self._content_seen = len(reasoning), len(content)
        if new:
            self.detector.extend(new)
        return self.abort and self.detector.found is not None


@dataclass(frozen=True)
class ModelIdentity:
    """The served model as its server reports it (SGLang 0.5.23 `entrypoints/http_server.py`):
    - `name`: `/model_info` `served_model_name`, else `model_path`;
    - `revision`: `/server_info` `revision`, the `--revision` (branch, tag or commit) the server was
      launched with: null by default (`arg_groups/fields/model.py`), and after a weight update still the
      launch's (`/server_info` reports the startup configuration);
    - `weight_version`: `/model_info` `weight_version`, "default" unless `--weight-version` or a weight
      update set it (`arg_groups/fields/serving.py`; the value in effect, `TokenizerManager.config_value`).
    """
    name: str
    revision: str | None = None
    weight_version: str | None = None

    def record_field(self) -> dict[str, str | None] | None:
        """The completion record's `model_revision`; None (left out of the record) when the server
        reported neither."""
        if self.revision is None and self.weight_version is None:
            return None
        return {"revision": self.revision, "weight_version": self.weight_version}


def identity_from_model_info(info: Any) -> ModelIdentity:
    """The name and weight version of a `/model_info` answer (its revision is `/server_info`'s)."""
    if not isinstance(info, dict):
        return ModelIdentity("unknown")
    name = str(info.get("served_model_name") or info.get("model_path") or "unknown")
    return ModelIdentity(name, weight_version=_reported(info.get("weight_version")))


def revision_from_server_info(info: Any) -> str | None:
    """`revision` of a `/server_info` answer: `server_args.resolved_dict()` flat, like every launch
    setting (sglang 0.5.23 `utils/common.py::build_server_info`)."""
    return _reported(info.get("revision")) if isinstance(info, dict) else None


class ServerInfo:
    def __init__(self, http: httpx.Client) -> None:
        self.http = http
        self._models: dict[str, ModelIdentity] = {}  # from /model_info, without the revision
        self._stream_modes: dict[str, StreamMode] = {}
        self._revisions: dict[str, str | None] = {}  # from the same /server_info answer as the mode
        self._asking = threading.Lock()  # 150 threads starting at once ask /server_info once

    def forget(self, upstream: str) -> None:
        self._models.pop(upstream, None)
        self._stream_modes.pop(upstream, None)
        self._revisions.pop(upstream, None)

    def stream_mode(self, upstream: str) -> StreamMode:
        """Cumulative or incremental chunks, as the server's `/server_info` says, asked once per
        upstream; UNKNOWN (infer from the chunks) where neither it nor `/get_server_info` answers."""
        mode = self._stream_modes.get(upstream)
        if mode is not None:
            return mode
        with self._asking:
            mode = self._stream_modes.get(upstream)
            if mode is None:
                info = self.ask_server_info(upstream)
                if info is not None:
                    mode = StreamMode.from_server_info(info)
                    self._revisions[upstream] = revision_from_server_info(info)
                    self._stream_modes[upstream] = mode
        return mode or UNKNOWN

    def model_name(self, upstream: str) -> str:
        """The served model's name from `/model_info`."""
        return self._model(upstream).name

    def model_identity(self, upstream: str) -> ModelIdentity:
        """Name, revision and weight version, from the answers already cached: `/server_info` is
        asked here only where no stream asked it yet (the chat API does not need its stream mode)."""
        self.stream_mode(upstream)
        return replace(self._model(upstream), revision=self._revisions.get(upstream))

    def _model(self, upstream: str) -> ModelIdentity:
        model = self._models.get(upstream)
        if model is None:
            try:
                info = self.http.get(f"{upstream}/model_info", timeout=5.0).json()
            except (httpx.HTTPError, ValueError):
                return ModelIdentity("unknown")  # not cached: asked again with the next record
            model = self._models[upstream] = identity_from_model_info(info)
        return model

    def ask_server_info(self, upstream: str) -> dict[str, Any] | None:
        """The answer; None: could not ask now (asked again next time); {}: the server has no such
        page (the stream mode is then UNKNOWN, and the revision not reported)."""
        # /get_server_info is the older name, still an alias in 0.5.23 (entrypoints/http_server.py).
        for path in ("/server_info", "/get_server_info"):
            try:
                response = self.http.get(f"{upstream}{path}", timeout=10.0)
            except httpx.HTTPError:
                return None
            if response.status_code in (404, 405):
                continue
            if response.status_code != 200:
                return None
            try:
                info = response.json()
            except ValueError:
                continue
            return info if isinstance(info, dict) else {}
        return {}


def _reported(value: Any) -> str | None:
    """A value as the server reported it; None where it is missing or not a string."""
    return value if isinstance(value, str) else None


log = logging.getLogger(__name__)


@dataclass
class Generation:
    finish_reason: dict[str, Any]
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cached_tokens: int
    first_token_s: float | None
    duration_s: float
    e2e_latency: float | None = None
    # The request id sent as `rid` (SGLang's request id: its logs, /abort_request).
    rid: str | None = None
    # /generate: the raw text (special tokens kept) and ids, split by the worker.
    text: str = ""
    output_ids: list[int] | None = None
    # /v1/chat/completions: the server already split them.
    reasoning: str | None = None
    content: str | None = None
    # The loop guard's finding (`Loop.to_dict()`); with `abort` the stream was cut there.
    loop: dict[str, int] | None = None


class _Assembler(Protocol):
    chunks: int

    @property
    def finished(self) -> bool: ...

    def feed(self, chunk: dict[str, Any]) -> None: ...


class SglangClient:
    def __init__(self, *, max_connections: int, connect_timeout_s: float, stall_timeout_s: float) -> None:
        # httpx defaults (100 connections, 5 s timeouts) would starve 150 streams and kill a quiet
        # reasoning phase: size the pool above the in-flight cap, read timeout = stall timeout.
        self._timeout = httpx.Timeout(connect=connect_timeout_s, read=stall_timeout_s, write=30.0, pool=60.0)
        # One TLS context for every client below: building one reads the CA bundle (~50 ms).
        self._tls = httpx.create_ssl_context()
        # Short requests (/server_info, /abort_request) share one pool.
        self.http = httpx.Client(
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            timeout=self._timeout, verify=self._tls,
        )
        self.stall_timeout_s = stall_timeout_s
        self.servers = ServerInfo(self.http)
        self.streams = StreamConnections(connect_timeout_s=connect_timeout_s, stall_timeout_s=stall_timeout_s,
                                         tls=self._tls)

    def close(self) -> None:
        self.http.close()
        self.streams.close()

    def interrupt_streams(self) -> None:
        """Wake every thread blocked reading a stream (a long prefill, a silent server); each
        stream then ends with a transport error, which the caller reads as its shutdown."""
        self.streams.interrupt()

    def forget(self, upstream: str) -> None:
        """The host came back (its breaker closed): it may have restarted with other settings."""
        self.servers.forget(upstream)

    def model_name(self, upstream: str) -> str:
        return self.servers.model_name(upstream)

    def model_identity(self, upstream: str) -> ModelIdentity:
        """Name, revision and weight version as the upstream reports them, cached per upstream."""
        return self.servers.model_identity(upstream)

    def generate(self, upstream: str, body: dict[str, Any], *, deadline: float,
                 should_stop: Callable[[], bool] = lambda: False, watch: StreamWatch | None = None) -> Generation:
        """Native `/generate` streaming, cumulative or incremental as the server reports it; `watch`
        may cut it short (the loop guard), and the server is then asked to drop the request."""
        body = {"rid": new_rid(), **body}
        mode = self.servers.stream_mode(upstream)
        started = time.monotonic()
        assembler = StreamAssembler(incremental=mode.incremental)
        cut = (lambda: watch.ids_arrived(assembler.output_ids)) if watch is not None else None
        first_token_s = self._stream(upstream, "/generate", body, assembler, started, deadline, should_stop,
                                     has_tokens=lambda: bool(assembler.output_ids), cut=cut)
        if cut is not None and not assembler.finished:
            self.abort_request(upstream, body["rid"])
            assembler.finish_reason = {"type": "loop"}
        meta = assembler.meta
        return Generation(
            finish_reason=assembler.finish_reason or {},
            prompt_tokens=int(meta.get("prompt_tokens") or 0),
            completion_tokens=int(meta.get("completion_tokens") or 0),
            reasoning_tokens=int(meta.get("reasoning_tokens") or 0),
            cached_tokens=int(meta.get("cached_tokens") or 0),
            first_token_s=first_token_s, duration_s=time.monotonic() - started,
            e2e_latency=meta.get("e2e_latency"), text=assembler.text, output_ids=assembler.output_ids,
            rid=body["rid"], loop=_loop_of(watch),
        )

    def chat(self, upstream: str, body: dict[str, Any], *, deadline: float,
             should_stop: Callable[[], bool] = lambda: False, watch: StreamWatch | None = None) -> Generation:
        """`/v1/chat/completions` streaming; asks for usage in the last chunk. A stream the loop
        guard cut has no usage chunk: its counts are then unknown (0)."""
        started = time.monotonic()
        assembler = ChatStreamAssembler()
        body = {"rid": new_rid(), **body, "stream": True, "stream_options": {"include_usage": True}}
        cut = (lambda: watch.text_arrived(assembler.reasoning, assembler.content)) if watch is not None else None
        first_token_s = self._stream(upstream, "/v1/chat/completions", body, assembler, started, deadline,
                                     should_stop, has_tokens=lambda: assembler.has_tokens, cut=cut)
        if cut is not None and not assembler.finished:
            self.abort_request(upstream, body["rid"])
            assembler.finish_reason = {"type": "loop"}
        else:
            assembler.verify()
        usage = assembler.usage
        details = usage.get("completion_tokens_details") or {}
        prompt_details = usage.get("prompt_tokens_details") or {}
        return Generation(
            finish_reason=assembler.finish_reason or {},
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            reasoning_tokens=int(usage.get("reasoning_tokens") or details.get("reasoning_tokens") or 0),
            cached_tokens=int(prompt_details.get("cached_tokens") or 0),
            first_token_s=first_token_s, duration_s=time.monotonic() - started,
            reasoning=assembler.reasoning, content=assembler.content, rid=body["rid"], loop=_loop_of(watch),
        )

    def abort_request(self, upstream: str, rid: str) -> None:
        """Ask the server to drop a request whose stream we closed. SGLang 0.5.23 itself drops it at
        once when the stream's connection closes (`managers/tokenizer_manager.py` `generate_request`
        releases it on the cancelled generator, `_release_req_states_on_failure`; the 2 s
        `create_abort_task` of `entrypoints/http_server.py` is a fallback): measured on the real
        server, its running count was 0 within 1 s (tests/sglang_real/test_loop_guard_on_sglang.py). The
        explicit abort still frees the slot where something between us and the scheduler (a router,
        a proxy) keeps its own connection open. `POST /abort_request {"rid": ...}` (0.5.23
        `http_server.py::abort_request`, `AbortReq`)
        answers 200 for a finished or unknown rid too. Best effort: the disconnect frees it anyway."""
        try:
            response = self.http.post(f"{upstream}/abort_request", json={"rid": rid}, timeout=5.0)
            if response.status_code != 200:
                log.warning("%s/abort_request for %s answered %d", upstream, rid, response.status_code)
        except httpx.HTTPError as error:
            log.warning("%s/abort_request for %s failed: %s", upstream, rid, error)

    def _stream(self, upstream: str, path: str, body: dict[str, Any], assembler: _Assembler, started: float,
                deadline: float, should_stop: Callable[[], bool], has_tokens: Callable[[], bool],
                cut: Callable[[], bool] | None = None) -> float | None:
        """Feeds every `data:` chunk to the assembler; returns the time to the first token. `cut`
        is asked after each chunk; True ends the stream there (closing the connection), unfinished."""
        first_token_s = None
        url = upstream + path
        with (transport_errors(url, self.stall_timeout_s, should_stop),
              self.streams.post(upstream, path, body) as response):
            if response.status != 200:
                raise http_error(response.status, url, response.error_body())
            for data in data_payloads(response.blocks(lambda: assembler.finished)):
                if should_stop():
                    raise ShutdownRequested()
                if time.monotonic() > deadline:
                    raise DeadlineExceeded("generation ran past the task deadline")
                if data == b"[DONE]":
                    # Read on to the body's end rather than break: only a response read to its
                    # end leaves its connection fit for the next stream.
                    continue
                assembler.feed(_decode_chunk(data))
                if first_token_s is None and has_tokens():
                    first_token_s = time.monotonic() - started
                if cut is not None and cut() and not assembler.finished:
                    return first_token_s
        if not assembler.finished:
            if should_stop():
                raise ShutdownRequested()  # the shutdown cut it: the message goes back, not a failure
            raise StreamCut(f"stream from {url} ended after {assembler.chunks} chunks without a finish reason")
        return first_token_s


def _loop_of(watch: StreamWatch | None) -> dict[str, int] | None:
    return watch.loop.to_dict() if watch is not None and watch.loop is not None else None


def new_rid() -> str:
    """SGLang's own default is uuid4().hex (io_struct.py); ours is the same shape, made here so the
    worker knows it (logs, and `/abort_request` to free a slot)."""
    return uuid.uuid4().hex


def _decode_chunk(data: bytes) -> dict[str, Any]:
    try:
        chunk = json.loads(data)
    except ValueError:
        raise TransientError(f"malformed stream chunk: {data[:200]!r}") from None
    if not isinstance(chunk, dict):
        raise TransientError(f"unexpected stream chunk: {data[:200]!r}")
    return chunk
