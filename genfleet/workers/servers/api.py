"""The seam's terms: what the worker asks of a server, what a stream gives back, what a server says
about itself, and the interface every server kind implements (`ServerApi`).

Nothing here names an endpoint or a field of a server's answers: each kind maps its wire into these
types once, at its own boundary (`sglang.py`, `vllm.py`), the way httpx maps its transport's exceptions at
one place (`httpx/_transports/default.py`). The worker's modules use a server through these
terms; only the runtime, `genfleet run` and `doctor` build one (`kinds.AnyServer`), and the URL
checks read `transport.py`.
"""
from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from genfleet.common.fleet_stats import ServerLoad

if TYPE_CHECKING:
    from genfleet.workers.generation.loop_guard import StreamWatch


@dataclass(frozen=True)
class GenerationRequest:
    """One streamed generation, in the worker's terms; each server kind builds its own body from it.

    The prompt is `messages` (the server templates them: the chat API), else `input_ids` (the
    producer's ids, with a continued completion's ids after them), else `text`."""

    max_new_tokens: int
    # The run's sampling parameters under genfleet's names (the record's `sampling` field, which are
    # SGLang's `sampling_params` names); a kind renames what its server calls otherwise.
    sampling: Mapping[str, Any]
    input_ids: list[int] | None = None
    text: str | None = None
    messages: list[dict[str, Any]] | None = None
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    # Keep special tokens (a think marker) in the streamed text: without them reasoning silently
    # merges into the content.
    skip_special_tokens: bool = False
    # Tokens per streamed chunk, where the server lets a request choose.
    stream_interval: int = 1
    # The output starts inside the reasoning (the template opened it): the server is asked to count
    # reasoning tokens where it must be told.
    starts_in_reasoning: bool = False

    @property
    def chat(self) -> bool:
        return self.messages is not None


@dataclass(frozen=True)
class ModelIdentity:
    """The served model as its server reports it: its name, the revision it was launched with and
    its weight version; what the server does not say stays None, never guessed."""

    name: str
    revision: str | None = None
    weight_version: str | None = None

    def record_field(self) -> dict[str, str | None] | None:
        """The completion record's `model_revision`; None (left out of the record) when the server
        reported neither."""
        if self.revision is None and self.weight_version is None:
            return None
        return {"revision": self.revision, "weight_version": self.weight_version}


UNKNOWN_MODEL = ModelIdentity("unknown")


@dataclass
class Generation:
    """One stream's completion, whole and checked, in the record's terms."""

    # "stop" | "length" | "abort" | "loop" (the loop guard cut the stream there).
    finish: str
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cached_tokens: int
    first_token_s: float | None
    duration_s: float
    e2e_latency: float | None = None  # the server's own measure, where it reports one
    # What stopped it: a stop token's id, a stop string, or None.
    matched_stop: int | str | list[int] | None = None
    # The server lowered the request's max_new_tokens to this (its context, or KV pool, was full):
    # nothing more fits after the cut. None: it kept the request's budget, or does not say.
    granted_tokens: int | None = None
    # The request's id at the server (its logs, its abort).
    request_id: str | None = None
    # The raw text (special tokens kept) and ids, split by the worker...
    text: str = ""
    output_ids: list[int] | None = None
    # The prompt's last ids, which the server decoded `output_ids` after (the worker decodes them
    # the same way: workers/generation/completion_text.py).
    prompt_context: tuple[int, ...] = ()
    # The server detokenized with tokenizers' `DecodeStream` (vLLM's fast detokenizer), whose text
    # can leave out what the ids decode to (workers/generation/completion_text.py `decode_streamed`).
    decode_stream: bool = False
    # ...or, over the chat API, split by the server already.
    reasoning: str | None = None
    content: str | None = None
    # The loop guard's finding (`Loop.to_dict()`); with `abort` the stream was cut there.
    loop: dict[str, int] | None = None

    @property
    def stop_token(self) -> bool:
        """Whether a stop token (not a string) ended it: its ids then end with that token, which
        the server leaves out of the text."""
        return isinstance(self.matched_stop, int) and not isinstance(self.matched_stop, bool)


@dataclass(frozen=True)
class ServerDescription:
    """What a server says about itself, for `doctor` and for reading its streams."""

    model: ModelIdentity
    # What it does not say is None.
    reasoning_parser: str | None = None
    incremental: bool | None = None  # streams deltas (True) or the whole output so far (False)
    stream_interval: int | None = None
    context_length: int | None = None
    kind: str | None = None  # "sglang" or "vllm" (servers/kinds.py)
    version: str | None = None
    load_source: str | None = None  # the page its load is read from


class LoadProblem(enum.Enum):
    UNANSWERED = "unanswered"  # no answer now (the breaker and the probes judge the host)
    ABSENT = "absent"  # the server has no load page (an older server, a router in front)
    UNREADABLE = "unreadable"  # an answer, but not a load (an error page, another schema)


@dataclass(frozen=True)
class LoadReading:
    load: ServerLoad | None
    problem: LoadProblem | None = None
    detail: str = ""


@dataclass(frozen=True)
class Health:
    ready: bool
    reachable: bool
    detail: str = ""  # why not, in a few words naming what was asked


class ServerApi(Protocol):
    """A server kind, as the worker uses it. Every wire failure leaves `generate` as one of the
    typed errors of `workers/errors.py`."""

    # Where a server of this kind reports its load, for messages ("its /v1/loads ...").
    load_source: str

    def generate(self, upstream: str, request: GenerationRequest, *, deadline: float,
                 should_stop: Callable[[], bool] = ..., watch: StreamWatch | None = None) -> Generation:
        """Stream one generation; `watch` (the loop guard) sees each chunk and may cut it short, in
        which case the server is asked to drop the request."""
        ...

    def abort(self, upstream: str, request_id: str) -> None: ...

    def describe(self, upstream: str) -> ServerDescription:
        """The server's settings asked now (`doctor`); its model as cached by `model_identity`."""
        ...

    def model_identity(self, upstream: str) -> ModelIdentity:
        """Cached per upstream until `forget`."""
        ...

    def read_load(self, upstream: str) -> LoadReading: ...

    def health(self, upstream: str, timeout_s: float) -> Health: ...

    def forget(self, upstream: str) -> None:
        """The host came back (its breaker closed): it may have restarted with other settings."""
        ...

    def interrupt_streams(self) -> None:
        """Wake every thread blocked reading a stream; each stream then ends short."""
        ...

    def close(self) -> None: ...
