"""What a completion cut at max_new_tokens becomes (`--on-truncated`), decided once it is assembled.

- `keep`: the record is written as cut (`finish_reason: "length"`).
- `continue`: a follow-up task on the `long` queue asks `/generate` to go on from where the cut
  fell: its `input_ids` are the prompt's ids followed by every id generated so far, its
  `max_new_tokens` what is left of `max_new_tokens_total`. A model conditioned on its own prefix
  continues as if the budget had been larger from the start, so this costs only the extra tokens
  (and a prefill SGLang's prefix cache mostly absorbs) instead of generating the whole prefix again.
  The parts already generated travel in the payload (`Continuation`); the record is written once,
  by the last part, over the joined ids and text.
- `regenerate`: the prompt is asked again on `long` with `max_new_tokens_total`, from scratch (the
  only choice over the chat API, which returns text, not the ids a continuation is built from).

A completion the loop guard stopped or flagged is never continued: more of a loop is not data. Nor
is one the server itself stopped short of its max_new_tokens: its context is full (`server_cut`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from genfleet.common.queues import LONG
from genfleet.common.records import TaskPayload
from genfleet.workers.sglang.client import Generation

TRUNCATION_POLICIES = ("keep", "continue", "regenerate")


@dataclass(frozen=True)
class Continuation:
    """The parts of a completion generated so far (`TaskPayload.continuation`)."""
    output_ids: list[int]
    text: str
    completion_tokens: int
    reasoning_tokens: int
    cached_tokens: int
    prompt_tokens: int  # the first request's: the prompt itself
    parts: int  # requests that generated them
    first_token_s: float | None
    started_at: float  # when the first part began (the record's timing covers every part)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, payload: TaskPayload) -> Continuation | None:
        return None if payload.continuation is None else cls(**payload.continuation)


def prompt_with_prefix(input_ids: list[int] | None, prior: Continuation | None) -> list[int] | None:
    """A continuation's prompt: the prompt's ids, then every id generated so far."""
    if prior is None or input_ids is None:
        return input_ids
    return input_ids + prior.output_ids


def joined(prior: Continuation | None, generation: Generation,
           decode: Callable[[list[int]], str] | None = None) -> Generation:
    """The whole completion so far: the earlier parts, then this one. `decode` (the model's
    tokenizer) makes the text the decoding of the joined ids, as one request would have sent it
    (SGLang leaves a matched stop token out of the text); without it the parts' texts are joined,
    exact unless a cut split a multi-byte character."""
    if prior is None:
        return generation
    ids = prior.output_ids + (generation.output_ids or [])
    text = prior.text + generation.text
    if decode is not None:
        matched = generation.finish_reason.get("matched")
        stop_id = isinstance(matched, int) and not isinstance(matched, bool)
        text = decode(ids[:-1] if stop_id and ids else ids)
    return replace(
        generation, text=text, output_ids=ids,
        completion_tokens=prior.completion_tokens + generation.completion_tokens,
        reasoning_tokens=prior.reasoning_tokens + generation.reasoning_tokens,
        cached_tokens=prior.cached_tokens + generation.cached_tokens,
        prompt_tokens=prior.prompt_tokens, first_token_s=prior.first_token_s,
    )


def follow_up(payload: TaskPayload, generation: Generation, *, api: str, started_at: float) -> TaskPayload | None:
    """The task to publish instead of writing a record, or None to write it. `generation` is the
    whole completion so far (`joined`)."""
    if generation.finish_reason.get("type") != "length" or generation.loop is not None:
        return None
    if payload.regenerate != "last" or payload.on_truncated == "keep" or server_cut(payload, generation):
        return None
    total = max(payload.max_new_tokens_total or 0, payload.max_new_tokens)
    policy = payload.on_truncated
    if policy == "continue" and (api == "chat" or payload.input_ids is None or not generation.output_ids):
        policy = "regenerate"  # no token ids to continue from
    fresh = {"partition": LONG, "attempt": 1, "failed_upstream": None}
    if policy == "continue":
        left = total - generation.completion_tokens
        if left <= 0:
            return None
        prior = Continuation.of(payload)
        parts = Continuation(
            output_ids=list(generation.output_ids or []), text=generation.text,
            completion_tokens=generation.completion_tokens, reasoning_tokens=generation.reasoning_tokens,
            cached_tokens=generation.cached_tokens, prompt_tokens=generation.prompt_tokens,
            parts=prior.parts + 1 if prior else 1,  # this request included
            first_token_s=generation.first_token_s,
            started_at=prior.started_at if prior else started_at,
        )
        return replace(payload, max_new_tokens=left, continuation=parts.to_dict(), **fresh)
    if payload.regenerated or total <= payload.max_new_tokens:
        return None  # asked once with the larger budget already
    return replace(payload, max_new_tokens=total, regenerated=True, continuation=None, **fresh)


def server_cut(payload: TaskPayload, generation: Generation) -> bool:
    """Whether the server ended this part before the max_new_tokens it was asked for: SGLang lowers
    a request's budget to what its context (and KV pool) leaves, `context - 2 - input` at most
    (0.5.23 `managers/scheduler.py::init_req_max_new_tokens`), and reports the budget it kept as
    `finish_reason.length`. Nothing fits after such a cut: a follow-up's prompt (this one and all it
    generated) is past the scheduler's input bound, `context - 6` (`managers/utils.py::
    validate_input_length`), and would be refused as permanent, losing what was generated; and a
    regeneration would be cut at the same place."""
    granted = generation.finish_reason.get("length")
    return isinstance(granted, int) and not isinstance(granted, bool) and granted < payload.max_new_tokens
