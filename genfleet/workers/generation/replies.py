"""A prompt's replies, from the server's stream to the record: the turns to generate, the reply
loop over the upstreams, reasoning split from content, what a cut completion becomes
(`--on-truncated`), and the record of the whole completion.

Which assistant turns of a conversation to generate, and the prompt for each:
`last` (default): the producer already cut the conversation after its last user turn; one reply.
`all` (SpecForge's on-policy mode): every assistant turn in order, each conditioned on the model's
own earlier replies. Earlier replies enter the history as content only; the chat template decides
how past turns look (most drop past reasoning).

Each reply is routed to an upstream (`workers/upstreams.py`) and streamed through the server seam
(`workers/servers/`) with the loop guard watching; a continued completion resumes from the ids its
earlier parts generated, and its parts are joined before the split (`joined`).

Reasoning is split from content by the runtime's `CompletionSplitter`
(`workers/generation/completion_text.py`), over the text the ids give as the server decoded them:
after the prompt's last ids (`Generation.prompt_context`, set here).

What a completion cut at max_new_tokens becomes (`--on-truncated`), decided once it is assembled:
- `keep`: the record is written as cut (`finish_reason: "length"`).
- `continue`: a follow-up task on the `long` queue asks the server to go on from where the cut
  fell: its prompt is the prompt's ids followed by every id generated so far, its
  `max_new_tokens` what is left of `max_new_tokens_total`. A model conditioned on its own prefix
  continues as if the budget had been larger from the start, so this costs only the extra tokens
  (and a prefill the server's prefix cache mostly absorbs) instead of generating the whole prefix
  again. The parts already generated travel in the payload (`Continuation`); the record is written
  once, by the last part, over the joined ids and text.
- `regenerate`: the prompt is asked again on `long` with `max_new_tokens_total`, from scratch (the
  only choice over the chat API, which returns text, not the ids a continuation is built from).
A completion the loop guard stopped or flagged is never continued: more of a loop is not data. Nor
is one the server itself stopped short of its max_new_tokens: its context is full (`server_cut`).
A cut at a staged first cap (`--first-max-new-tokens`, workers/generation/first_cap.py) is not a
truncation: it always goes on, in its own queue, up to the prompt's real cap.
"""
from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from genfleet.common.queues import LONG
from genfleet.common.reasoning import get_format, starts_in_reasoning
from genfleet.common.records import CompletionRecord, TaskPayload, Timing, Turn, Usage
from genfleet.common.tokenizer import render_prompts
from genfleet.workers.errors import BudgetSpent, GenerationError, IntegrityError, PermanentError
from genfleet.workers.generation.completion_text import PROMPT_CONTEXT_IDS, decode_after
from genfleet.workers.generation.first_cap import next_stage
from genfleet.workers.generation.loop_guard import LoopThresholds, StreamWatch
from genfleet.workers.servers.api import Generation, GenerationRequest, ModelIdentity

if TYPE_CHECKING:  # the runtime is handed in; it never imports this module
    from genfleet.workers.runtime import WorkerRuntime

Message = dict[str, Any]


def reply_positions(messages: list[Message], mode: str) -> list[int]:
    """Indices where the model speaks; `len(messages)` means a reply appended at the end."""
    if mode == "last":
        return [len(messages)]
    positions = []
    seen_user = False
    for index, message in enumerate(messages):
        seen_user = seen_user or message["role"] == "user"
        if message["role"] == "assistant" and seen_user:
            positions.append(index)
    if messages and messages[-1]["role"] in ("user", "tool"):
        positions.append(len(messages))
    return positions


def history_before(messages: list[Message], position: int, replies: dict[int, Message]) -> list[Message]:
    """The prompt for the reply at `position`: earlier assistant turns replaced by the model's own."""
    return [replies.get(index, message) for index, message in enumerate(messages[:position])]


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
        text = decode(ids[:-1] if generation.stop_token and ids else ids)
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
    if generation.finish != "length" or server_cut(payload, generation):
        return None
    if payload.staged_from is not None and generation.output_ids and generation.loop is None:
        # Cut at a staged cap (workers/generation/first_cap.py): go on towards the real cap, in the
        # prompt's own queue, whatever `on_truncated` says (only a cut at the real cap is judged by
        # it), asking the next stage. A loop found on the chunk that reached the cap ends the
        # completion there, as in one request.
        left = payload.staged_from - generation.completion_tokens
        ask = next_stage(payload.max_new_tokens, left)
        return _continued(payload, generation, ask, started_at, partition=payload.partition,
                          staged_from=payload.staged_from if ask < left else None)
    if generation.loop is not None or payload.regenerate != "last" or payload.on_truncated == "keep":
        return None
    total = max(payload.max_new_tokens_total or 0, payload.max_new_tokens)
    policy = payload.on_truncated
    if policy == "continue" and (api == "chat" or payload.input_ids is None or not generation.output_ids):
        policy = "regenerate"  # no token ids to continue from
    if policy == "continue":
        return _continued(payload, generation, total - generation.completion_tokens, started_at, partition=LONG)
    # The budget this completion was cut at: this part's, or with a staged first cap the whole
    # chain's (this part asked only what was left of it).
    if payload.regenerated or total <= max(payload.max_new_tokens, generation.completion_tokens):
        return None  # asked once with the larger budget already
    return replace(payload, max_new_tokens=total, regenerated=True, continuation=None, partition=LONG,
                   attempt=1, failed_upstream=None)


def _continued(payload: TaskPayload, generation: Generation, left: int, started_at: float,
               **changes: Any) -> TaskPayload | None:
    """The exact continuation of `generation` asking `left` more tokens; None when nothing is left."""
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
    return replace(payload, max_new_tokens=left, continuation=parts.to_dict(), attempt=1, failed_upstream=None,
                   **changes)


def server_cut(payload: TaskPayload, generation: Generation) -> bool:
    """Whether the server ended this part before the max_new_tokens it was asked for, having
    lowered the request's budget to what its context (and KV pool) leaves (`granted_tokens`).
    Nothing fits after such a cut: a follow-up's prompt (this one and all it generated) is past the
    server's input bound (SGLang 0.5.23: `context - 6`, `managers/utils.py::validate_input_length`),
    and would be refused as permanent, losing what was generated; and a regeneration would be cut at
    the same place."""
    granted = generation.granted_tokens
    return granted is not None and granted < payload.max_new_tokens


# Leading prompt tokens that pick a host: a shorter prompt is hashed whole, so unrelated prompts
# spread evenly; prompts sharing a longer prefix (a system prompt) meet on one host's cache.
AFFINITY_PREFIX_TOKENS = 256


@dataclass(frozen=True)
class Replies:
    """What a task generated: the record of the whole completion, or the follow-up to publish
    instead (`next_part`: the completion was cut, `follow_up`)."""

    record: CompletionRecord | None
    next_part: TaskPayload | None
    completion_tokens: int  # of the whole completion so far


def generate_replies(payload: TaskPayload, runtime: WorkerRuntime, deadline: float, started_at: float) -> Replies:
    """Each reply the payload asks for, in order, and what becomes of them."""
    replies: dict[int, dict] = {}
    turns = []
    prompt = payload.messages
    for position in reply_positions(payload.messages, payload.regenerate):
        prompt = history_before(payload.messages, position, replies)
        generation, upstream = stream_reply(payload, runtime, prompt, deadline)
        try:
            split = runtime.splitter.split(generation, payload.chat_template_kwargs)
        except IntegrityError as error:
            # Found once the stream ended, by decoding its ids: it is still that host's stream,
            # which the warning names and the retry avoids.
            error.upstream = error.upstream or upstream
            raise
        turn = Turn(
            reasoning=split.reasoning, content=split.content,
            # A loop the guard stopped or flagged reads "loop", whatever ended the stream.
            finish_reason="loop" if generation.loop else generation.finish,
            matched_stop=generation.matched_stop,
            usage=Usage(prompt_tokens=generation.prompt_tokens, completion_tokens=generation.completion_tokens,
                        reasoning_tokens=generation.reasoning_tokens, cached_tokens=generation.cached_tokens),
            upstream=upstream,
            output_ids=generation.output_ids if payload.keep_token_ids else None,
            loop=generation.loop,
        )
        turns.append((turn, generation))
        replies[position] = {"role": "assistant", "content": split.content}
    last = turns[-1][1]
    next_part = follow_up(payload, last, api=runtime.settings.api, started_at=started_at)
    if next_part is not None:
        return Replies(None, next_part, last.completion_tokens)
    # Asked once a slot is free again (cached per upstream by the seam): the record names its model.
    model = runtime.server.model_identity(turns[-1][0].upstream)
    record = record_of(payload, runtime.name, turns, prompt, started_at, model)
    return Replies(record, next_part, last.completion_tokens)


def record_of(payload: TaskPayload, worker: str, turns: list[tuple[Turn, Generation]], prompt: list[dict],
              started_at: float, model: ModelIdentity) -> CompletionRecord:
    """The record of a whole completion: its timing covers every part of a continued one."""
    last, generation = turns[-1]
    prior = Continuation.of(payload)
    if prior is not None:
        started_at = prior.started_at
    usage = Usage(
        prompt_tokens=sum(t.usage.prompt_tokens for t, _ in turns) or payload.prompt_tokens,
        completion_tokens=sum(t.usage.completion_tokens for t, _ in turns),
        reasoning_tokens=sum(t.usage.reasoning_tokens for t, _ in turns),
        cached_tokens=sum(t.usage.cached_tokens for t, _ in turns),
    )
    return CompletionRecord(
        id=payload.id, run=payload.run, dataset=payload.dataset, partition=payload.partition,
        messages=prompt, reasoning=last.reasoning, content=last.content,
        finish_reason=last.finish_reason, matched_stop=last.matched_stop, usage=usage,
        upstream=last.upstream, model=model.name, sampling=payload.sampling,
        timing=Timing(enqueued_at=payload.enqueued_at, started_at=started_at,
                      first_token_s=turns[0][1].first_token_s, duration_s=time.time() - started_at,
                      e2e_latency=generation.e2e_latency),
        attempts=payload.attempt, worker=worker, output_ids=last.output_ids,
        turns=[asdict(turn) for turn, _ in turns] if payload.regenerate == "all" else None,
        row=payload.row,
        loop=next((turn.loop for turn, _ in turns if turn.loop), None),
        continued=prior.parts if prior is not None else None,
        regenerated=True if payload.regenerated else None, sample=payload.sample,
        model_revision=model.record_field(),
    )


def stream_reply(payload: TaskPayload, runtime: WorkerRuntime, prompt: list[dict],
                 deadline: float) -> tuple[Generation, str]:
    """The reply to `prompt`: with the earlier parts of a continued completion joined in front."""
    settings, pool = runtime.settings, runtime.upstreams
    prior = Continuation.of(payload)
    own_ids = None if settings.api == "chat" else prompt_ids(payload, runtime, prompt)
    input_ids = prompt_with_prefix(own_ids, prior)
    # What the server decodes the completion after: the prompt's last ids (a continued part's
    # text is decoded again whole, after the same ids: `joined`).
    context = tuple(own_ids[-PROMPT_CONTEXT_IDS:]) if own_ids else ()
    watch = loop_watch(payload, runtime, prior)
    stop = runtime.should_stop  # the worker's shutdown, or this copy's message delivered again
    # Before any GPU time is spent: a record that cannot be written is work thrown away.
    runtime.disk.wait_writable(settings.disk_wait_s, stop)
    with pool.lease(avoid=payload.failed_upstream, wait_s=max(deadline - time.monotonic(), 1.0),
                    should_stop=stop, affinity=affinity_key(payload), prompt=prompt_identity(payload)) as upstream:
        # Checked once a slot is held, right before generating: a spare thread may have waited.
        # Prompts already streaming may still overshoot the budget by their own length.
        if budget_spent(payload, runtime):
            raise BudgetSpent()
        request = GenerationRequest(
            max_new_tokens=payload.max_new_tokens, sampling=payload.sampling,
            messages=prompt if settings.api == "chat" else None, input_ids=input_ids, text=payload.text,
            chat_template_kwargs=payload.chat_template_kwargs, skip_special_tokens=settings.skip_special_tokens,
            stream_interval=settings.stream_interval,
            starts_in_reasoning=in_reasoning(payload, settings.reasoning_parser, prior))
        try:
            generation = runtime.server.generate(upstream, request, deadline=deadline, should_stop=stop, watch=watch)
        except GenerationError as error:
            error.upstream = upstream
            pool.report(upstream, ok=not error.blames_upstream)
            raise
        pool.report(upstream, ok=True)
        generation = replace(generation, prompt_context=context)
        return joined(prior, generation, decode=exact_decoder(runtime, context)), upstream


def in_reasoning(payload: TaskPayload, parser: str, prior: Continuation | None) -> bool:
    """Whether this request's output starts inside the reasoning, so the server is asked to count
    its reasoning tokens (`GenerationRequest.starts_in_reasoning`): the template opened it, and no
    earlier part of a continued completion closed it (the server counted every token of those parts
    as reasoning, or it did not)."""
    if not starts_in_reasoning(get_format(parser), payload.chat_template_kwargs):
        return False
    return prior is None or prior.reasoning_tokens >= prior.completion_tokens


def exact_decoder(runtime: WorkerRuntime, context: Sequence[int]) -> Callable[[list[int]], str] | None:
    """With the model's tokenizer on the worker, a continued completion's text is decoded from its
    joined ids, after the prompt's `context` as the server decodes: each part's server text is
    decoded on its own, so a character whose bytes a cut split would be lost (a replacement
    character at the end of one part, the rest of its bytes dropped at the start of the next)."""
    tokenizer, skip = runtime.tokenizer, runtime.settings.skip_special_tokens
    if tokenizer is None:
        return None
    return lambda ids: decode_after(tokenizer, context, ids, skip_special_tokens=skip)


def affinity_key(payload: TaskPayload) -> bytes:
    """What decides which host's prefix cache a request should find warm (workers/upstreams.py):
    the prompt's leading token ids, which its samples, the parts of its continued completion and
    every prompt sharing a long system prompt have in common; for a conversation regenerated turn
    by turn (templated here, turn by turn) or over the chat API (no ids), the prompt's own id."""
    if payload.regenerate == "all" or not payload.input_ids:
        return b"prompt:" + payload.prompt_id.encode()
    return array("I", payload.input_ids[:AFFINITY_PREFIX_TOKENS]).tobytes()


def prompt_identity(payload: TaskPayload) -> bytes:
    """Which prompt this is, whole: its samples, the turns of its conversation and the parts of its
    continued completion share it (and their host's cache of it: workers/upstreams.py)."""
    return f"{payload.run}\0{payload.prompt_id}".encode()


def loop_watch(payload: TaskPayload, runtime: WorkerRuntime, prior: Continuation | None) -> StreamWatch | None:
    """The loop guard for one stream: over token ids (`/generate`, the earlier parts of a continued
    completion first, so a loop across the cut is seen) or over characters (the chat API)."""
    if payload.loop_guard == "off":
        return None
    if runtime.settings.api == "chat":
        return StreamWatch(payload.loop_guard, loop_thresholds(runtime, characters=True))
    return StreamWatch(payload.loop_guard, loop_thresholds(runtime), prefix=prior.output_ids if prior else ())


def loop_thresholds(runtime: WorkerRuntime, *, characters: bool = False) -> LoopThresholds:
    """The detector's defaults, with the worker's GENFLEET_LOOP_* settings over them (in tokens;
    scaled like the defaults for characters)."""
    settings = runtime.settings
    base = LoopThresholds()
    given = {name: value for name in ("max_period", "min_repeats", "min_span")
             if (value := getattr(settings, f"loop_{name}")) is not None}
    tokens = replace(base, **given)
    return tokens if not characters else LoopThresholds.for_characters(tokens)


def budget_spent(payload: TaskPayload, runtime: WorkerRuntime) -> bool:
    """Whether the dataset's budget is used up. A continued completion is finished whatever the
    budget says: its earlier parts are already paid for, and skipping it would throw them away."""
    budget = payload.max_tokens_per_dataset
    if budget is None or payload.continuation is not None:
        return False
    return runtime.run_state(payload.run).completion_tokens(payload.dataset) >= budget


def prompt_ids(payload: TaskPayload, runtime: WorkerRuntime, prompt: list[dict]) -> list[int] | None:
    """The producer's ids for the first reply; later turns are templated here, with the model's own
    replies in the history."""
    if payload.regenerate == "last":
        return payload.input_ids
    if runtime.tokenizer is None:
        raise PermanentError("--regenerate all over /generate needs the model's tokenizer on the worker: "
                             "set GENFLEET_TOKENIZER=/path/to/model (or GENFLEET_API=chat)")
    return render_prompts(runtime.tokenizer, [prompt], payload.chat_template_kwargs)[0]
