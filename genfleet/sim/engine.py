"""The simulator's decode engine: decode steps and chunk cadence, aborts and disconnects, the clock and
the loop that streams each request.

Decode steps and the stream's chunk cadence: at which generated-token counts a chunk goes out.

SGLang 0.5.23 `managers/scheduler_components/output_streamer.py` (`_GenerationStreamAccumulator.
accept`) decides per scheduler step whether a streaming request's new tokens are sent:

    num_unsent = len(req.output_ids) - req.send_token_offset
    should_output = (stream_interval == 1 or num_unsent >= stream_interval
                     or (req.send_token_offset == 0 and num_unsent > 0))

and a finished request always gets its (final) chunk. So the first token (prefill's) goes out
alone, then a chunk whenever at least `stream_interval` tokens are unsent after a step. A step
appends one token in plain decoding but several under speculative decoding ("a step can append
several tokens (speculative decoding, dLLM), so it can pass a multiple of the interval without
landing on it", same file), so a chunk may carry more than `stream_interval` tokens. A step that
reaches the stop token ends the request there (`Req.output_ids_through_stop`,
`managers/schedule_batch.py`): the last step is cut at the end, and its tokens go out in the
final chunk, with whatever else was unsent.

Everything here is a pure function of its arguments, so a test predicts a stream's chunks exactly.

Ending a request before its finish, as SGLang 0.5.23 does: `POST /abort_request`, and a client
that disconnects.

`/abort_request` (`{"rid": ..., "abort_all": false}`; `entrypoints/http_server.py` `abort_request`
-> `TokenizerManager.abort_request`, `managers/tokenizer_manager.py`) answers 200 with an empty body,
whatever happened: an empty rid without abort_all is ignored, and so is a rid the server does not
hold. A rid it holds (waiting, running, or decoding on after its client left) goes to the scheduler,
which aborts every request whose rid STARTS WITH it (`Scheduler.abort_request`,
`managers/scheduler.py`: `req.rid.startswith(recv_req.rid)`); `abort_all` aborts them all; a rid
already aborted is not sent again (`abort_sent`). An aborted request frees its slot at once and ends
with an ordinary last chunk (then `[DONE]`), or a 200 body when not streaming (an abort without a
status_code is no error: `_handle_abort_finish_reason`):

- running: `FINISH_ABORT().to_json()` (`managers/schedule_batch.py`), `{"type": "abort", "message":
  "Aborted", "status_code": null, "err_type": null}`, with every token decoded so far. (SGLang runs
  one more decode pass first, "Abort method 3", and sends its token too; the sim stops at once.)
- waiting for a slot, or holding one but still queued for prefill (sim.capacity; both are
  SGLang's waiting queue): `{"type": "abort", "message": "Abort in waiting queue"}` and no tokens
  (`_handle_abort_req`; SGLang's meta_info then lacks prompt_tokens and the other counts, the sim's
  has them). One in the prefill batch running now is running: the batch runs on without it.

A client that disconnects does not free its slot at once: the request decodes on (its tokens count
in `tokens_generated`) until SGLang notices and aborts it, counted in `aborted_requests`:

- a stream: Starlette runs the response's background task once the client is gone, and
  `create_abort_task` sleeps 2 s before it aborts (`--disconnect-abort-s`, 0 for at once);
- a non-streaming request: `_stream_one_response` asks `request.is_disconnected()` when an output
  arrives, which the scheduler sends every 50 tokens (`SGLANG_FORCE_STREAM_INTERVAL`,
  `managers/scheduler_components/output_streamer.py`), or when its 4 s wait times out
  (`SGLANG_REQUEST_STATE_WAIT_TIMEOUT`): the sim aborts at the next 50-token output or the next 4 s
  since arrival (SGLang restarts that wait at each output; rarely sooner than 50 tokens).

A request that finishes before that finishes (no abort). Nothing is sent to a client that left, and
no completion log line is written for it.

One request's generated-token count, read off the shared decode clock (sim.capacity), and its naps.

The clock stands still while a prefill batch runs (sim.capacity), so a request's tokens come
out later when other requests are prefilled; a nap is the clock's own estimate, re-checked on waking.

The simulated scheduler: one request's slot, its turn in the server's prefill lane, which
prefills what the prefix cache lacks (sim.capacity, sim.capacity), paced decode, chunk
cadence, fault and abort (sim.engine).
"""
from __future__ import annotations

import asyncio
import itertools
import math
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from genfleet.sim.capacity import Capacity, KvClaim, PrefillLane, PrefillTurn, PrefixCache
from genfleet.sim.completion import CompletionPlan
from genfleet.sim.faults import Corruption, Fault, FaultKind
from genfleet.sim.wire import DONE, abort_finish

# Mixed into the completion seed so step sizes do not replay the completion's word draws.
_STEP_SEED_SALT = 0x5E_5EED_C4A7_57E9


@dataclass(frozen=True)
class DecodeSteps:
    """How many tokens each decode step appends: uniform over [low, high], drawn per step.

    (1, 1) is plain decoding (the default), (N, N) `--tokens-per-step N`, and (1, MAX)
    `--spec-tokens MAX`: speculative decoding, where a verify step accepts 1..MAX tokens (the
    accepted drafts plus the bonus token). Draws come from an RNG seeded by the request's
    completion seed (`CompletionPlan.rng_seed`), so a prompt and seed always stream alike.
    """

    low: int = 1
    high: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.high:
            raise ValueError(f"decode steps need 1 <= low <= high, got {self.low}..{self.high}")

    @property
    def fixed(self) -> bool:
        return self.low == self.high

    def describe(self) -> str:
        return f"{self.low} token(s)/step" if self.fixed else f"{self.low}..{self.high} tokens/step"

    def boundaries(self, rng_seed: int) -> Iterator[int]:
        """Generated-token counts after each step, without end: 1 (prefill's token), then one step
        more each time."""
        if self.fixed:
            yield from itertools.count(1, self.low)
            return
        rand = random.Random(rng_seed ^ _STEP_SEED_SALT).random
        low, span, count = self.low, self.high - self.low + 1, 1
        while True:
            yield count
            count += low + int(rand() * span)

    def chunk_counts(self, limit: int, stream_interval: int, rng_seed: int) -> Iterator[int]:
        """The counts below `limit` at which a streaming request gets a (non-final) chunk."""
        interval = max(1, stream_interval)
        if self.fixed:
            # Chunks land on step boundaries 1 + k*N; from one, the next is the first boundary at
            # least `interval` further on: ceil(interval / N) steps.
            step = self.low
            return iter(range(1, limit, step * -(-interval // step)))
        return _chunk_counts(self.boundaries(rng_seed), limit, interval)

    def stream_counts(self, total: int, stream_interval: int, rng_seed: int) -> list[int]:
        """Every chunk of a stream that ends at `total` tokens, as the completion_tokens each one
        reports: the non-final chunks, then the final one (which carries whatever is left)."""
        return [*self.chunk_counts(total, stream_interval, rng_seed), total]


def _chunk_counts(boundaries: Iterable[int], limit: int, interval: int) -> Iterator[int]:
    sent = 0
    for count in boundaries:
        if count >= limit:
            return
        # SGLang's test, with the first token as the `send_token_offset == 0` case.
        if interval == 1 or count - sent >= interval or sent == 0:
            yield count
            sent = count


ABORTED: dict[str, Any] = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
ABORTED_WHILE_WAITING: dict[str, Any] = {"type": "abort", "message": "Abort in waiting queue"}
FORCE_STREAM_INTERVAL = 50  # tokens between a non-streaming request's outputs
STATE_WAIT_TIMEOUT_S = 4.0  # how often a silent non-streaming request looks for its client


class Progress(Protocol):
    """The generated-token count a request has reached (the engine's decode clock)."""

    def ready(self, limit: int) -> int: ...


class RequestControl:
    """One request's slot, naps and end, which an abort or the client's leaving may cut short.

    The engine takes the slot, waits for its prefill batch, naps through decoding, and reports the
    end (`end`) with what it served; `abort` frees the slot at once and wakes the engine, which
    then sends the abort's last chunk. `sent` is what the client has been written so far."""

    def __init__(
        self,
        rid: str,
        *,
        stream: bool,
        capacity: Capacity,
        disconnect_abort_s: float,
        on_served: Callable[[Served], None] | None = None,
        on_cut: Callable[[int], None] | None = None,
    ) -> None:
        self.rid, self.stream = rid, stream
        self._capacity = capacity
        self._disconnect_abort_s = disconnect_abort_s
        self._on_served, self._on_cut = on_served, on_cut
        # Held, not looked up per nap: asyncio.get_running_loop() costs a getpid() syscall on
        # Python 3.11, and streams nap thousands of times a second.
        self._loop = asyncio.get_running_loop()
        self._arrived = self._loop.time()
        self.abort_finish: dict[str, Any] | None = None
        self.decoded_at_abort = 0
        self.struck: tuple[str, ...] = ()  # faults that struck before an abort (the log's "faults")
        self.client_gone = self.ended = False
        self.sent = 0
        self._sent_before_leaving = 0
        self._holds_slot = False
        self._claim: KvClaim | None = None
        self._prefill: PrefillTurn | None = None  # while it waits for its prefill batch
        self._progress: Progress | None = None
        self._end = self._recorded = 0
        self._nap: asyncio.Future[None] | None = None
        self._waiting: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    @property
    def aborted(self) -> bool:
        return self.abort_finish is not None

    @property
    def decoded(self) -> int:
        """Tokens decoded so far, as recorded (`record_decoded`, or an abort's count)."""
        return self._recorded

    # -- the engine's side --------------------------------------------------------------------

    async def take_slot(self, claim: KvClaim | None = None) -> bool:
        """Wait for a running slot (and `claim`'s room in the KV cache); False if aborted first
        (then it holds none)."""
        if self.aborted:
            return False
        self._claim = claim
        waiting = self._waiting = asyncio.ensure_future(self._capacity.acquire(claim))
        try:
            await asyncio.wait((waiting,))
        finally:
            self._waiting = None
            waiting.cancel()  # only if we were cancelled ourselves; a finished wait ignores it
        if waiting.cancelled():
            return False
        waiting.result()  # surface a crash in the capacity model
        self._holds_slot = True
        return True

    def release_slot(self) -> None:
        if self._holds_slot:
            self._holds_slot = False
            self._capacity.release(self._claim)

    def start_decoding(self, progress: Progress, end: int) -> None:
        self._progress, self._end = progress, end

    def record_decoded(self, count: int) -> None:
        """`count` tokens decoded so far: the new ones count in tokens_generated."""
        if count > self._recorded:
            self._capacity.record_tokens(count - self._recorded)
            self._recorded = count

    async def nap(self, delay: float | None, *, until: asyncio.Future[None] | None = None) -> None:
        """Sleep `delay` seconds (None: no limit) or until `until` is done, or less if an abort
        wakes it."""
        if self.aborted:
            return
        woken = self._loop.create_future()
        timer = self._loop.call_later(delay, _wake, woken) if delay is not None else None

        def wake(_: asyncio.Future[None]) -> None:
            _wake(woken)

        if until is not None:
            until.add_done_callback(wake)
        self._nap = woken
        try:
            await woken
        finally:
            self._nap = None
            if timer is not None:
                timer.cancel()
            if until is not None:
                until.remove_done_callback(wake)

    async def await_prefill(self, turn: PrefillTurn) -> None:
        """Wait until the request's prefill batch has run (sim.capacity), or less if aborted:
        aborted while still queued, it leaves the queue as if waiting for a slot."""
        self._prefill = turn
        try:
            await self.nap(None, until=turn.done)
        finally:
            self._prefill = None

    def end(self, served: Served) -> None:
        """The response's last bytes are about to go out: `on_cut` learns how many tokens the client
        got (all it carried, or what went out before the client left), `on_served` what was served
        (not once the client left). Both before the bytes: a client that has them finds the record."""
        self.ended = True
        self._cancel_timer()
        if self._on_cut is not None:
            self._on_cut(self._sent_before_leaving if self.client_gone else served.generated)
        if self._on_served is not None and not self.client_gone:
            self._on_served(served)

    # -- what ends it early -------------------------------------------------------------------

    def abort(self) -> None:
        """Abort now (a no-op once ended or aborted): free the slot, count what was decoded."""
        if self.aborted or self.ended:
            return
        self._cancel_timer()
        if self._holds_slot and self._prefill is not None and self._prefill.withdraw():
            self.abort_finish = ABORTED_WHILE_WAITING  # queued for prefill: nothing computed
            self.release_slot()
        elif self._holds_slot:  # running (in a prefill batch included)
            self.decoded_at_abort = self._progress.ready(self._end) if self._progress is not None else 0
            self.record_decoded(self.decoded_at_abort)
            self.abort_finish = ABORTED
            self.release_slot()
        else:
            self.abort_finish = ABORTED_WHILE_WAITING
            if self._waiting is not None:
                self._waiting.cancel()
        self._capacity.record_aborted()
        self._wake()

    def client_left(self) -> None:
        """The client disconnected: abort when SGLang would notice (see the module's docstring)."""
        self._capacity.record_disconnected()
        self.client_gone, self._sent_before_leaving = True, self.sent
        if self.ended or self.aborted:
            return
        if self.stream:
            delay = self._disconnect_abort_s
        else:
            waited = self._loop.time() - self._arrived
            delay = STATE_WAIT_TIMEOUT_S * (math.floor(waited / STATE_WAIT_TIMEOUT_S) + 1) - waited
        if delay <= 0:
            self.abort()
        else:
            self._timer = self._loop.call_later(delay, self.abort)

    def close(self) -> None:
        self._cancel_timer()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _wake(self) -> None:
        if self._nap is not None:
            _wake(self._nap)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class InFlight:
    """The requests the server holds, by rid (SGLang's `rid_to_state`): duplicates and aborts."""

    def __init__(self) -> None:
        self._controls: dict[str, RequestControl] = {}

    def __contains__(self, rid: str) -> bool:
        return rid in self._controls

    def add(self, control: RequestControl) -> None:
        self._controls[control.rid] = control

    def remove(self, control: RequestControl) -> None:
        if self._controls.get(control.rid) is control:
            del self._controls[control.rid]

    def abort_request(self, rid: str | None, abort_all: bool = False) -> None:
        """`TokenizerManager.abort_request` then `Scheduler.abort_request`: by rid prefix, or all."""
        if abort_all:
            targets = list(self._controls.values())
        elif rid and rid in self._controls:
            targets = [control for held, control in self._controls.items() if held.startswith(rid)]
        else:
            return  # an empty rid, or one no longer (or never) held: nothing to do
        for control in targets:
            control.abort()

    def abort_left(self) -> None:
        """Abort the requests whose clients left, at once: a stopping server need not wait for
        their aborts, which nobody would see."""
        for control in list(self._controls.values()):
            if control.client_gone:
                control.abort()


class DecodeClock:
    """Where a request is in its decoding: the shared clock's advance since its prefill ended."""

    def __init__(self, capacity: Capacity, tick: float, control: RequestControl) -> None:
        self._capacity = capacity
        # The first token comes out of prefill, so the request starts one token in.
        self._origin = capacity.progress() - 1.0
        self._tick = tick
        self._control = control

    def ready(self, limit: int) -> int:
        # The epsilon keeps rounding in `origin` from holding back a token that is due.
        return min(limit, math.floor(self._capacity.progress() - self._origin + 1e-9))

    async def sleep_until(self, count: int) -> None:
        """Sleep until `count` tokens are due if `running` holds and no further prefill batch
        starts (the running one's pause counted), but at least a tick: waking per token would burn
        the CPU the clients need. The caller re-reads `ready` on waking; an abort or the client's
        leaving wakes it early (`RequestControl.nap`)."""
        await self._control.nap(max(self._tick, self._capacity.seconds_until(self._origin + count)))


class Responder(Protocol):
    """Where a generation's bytes go: one JSON response, or an SSE stream written piecewise."""

    async def respond(self, status: int, body: bytes) -> None: ...

    async def open_stream(self) -> None: ...

    async def write(self, data: bytes) -> None: ...

    async def close_stream(self, data: bytes) -> None: ...


class Frames(Protocol):
    """One API's bytes for a generation (`/generate`'s or the chat API's), at any token count."""

    # The prompt's tokens found in the prefix cache, which every chunk reports: set by the engine
    # when the request is scheduled, 0 until then (and for a request aborted while waiting).
    cached_tokens: int

    def chunk(self, generated: int, *, finish: dict[str, Any] | None = None, count_bias: int = 0) -> bytes:
        """The stream's events after `generated` tokens (maybe none); `finish` marks the last;
        `count_bias` is added to the completion_tokens the last one reports."""
        ...

    def body(self, finish: dict[str, Any] | None = None, *, count_bias: int = 0, generated: int | None = None) -> bytes:
        """The non-streaming response: the whole plan, or its first `generated` tokens (an abort)."""
        ...

    def streamed(self, generated: int) -> dict[str, Any]:
        """The text (and for chat, reasoning and content) the first `generated` tokens carried."""
        ...

    @property
    def counts_in_stream(self) -> bool:
        """Whether the stream's last chunk reports completion_tokens (a miscount shows there)."""
        ...

    def error_chunk(self) -> bytes: ...

    def abort_response(self) -> tuple[int, bytes]: ...

    def error_response(self) -> tuple[int, bytes]: ...


@dataclass(frozen=True)
class Served:
    """How a generation's response ended, for the completion log."""

    generated: int  # tokens whose text and ids the response carried (a dropped chunk's included)
    finish_reason: dict[str, Any] | None  # the one sent; None after an error
    faults: tuple[str, ...]  # what struck it: fault kinds, "drop_chunk", "miscount"


@dataclass(frozen=True)
class Generation:
    """A validated request, its planned completion and its fate."""

    plan: CompletionPlan
    frames: Frames
    prompt_tokens: int
    stream: bool
    stream_interval: int
    fault: Fault | None
    steps: DecodeSteps = DecodeSteps()
    prompt_ids: Sequence[int] = ()  # what the prefix cache is looked up and filled with
    max_new_tokens: int = 0  # what the KV cache reserves for it (sim.capacity)
    corruption: Corruption | None = None
    # Called as the last bytes of the response go out (never for a stall that nothing aborts, nor
    # for a client that left before them).
    on_served: Callable[[Served], None] | None = None
    # Called as the request ends, however it ends, with the output ids its client got.
    on_cut: Callable[[int], None] | None = None

    @property
    def end(self) -> int:
        """The generated-token count at which the request ends, by finishing or by its fault."""
        total = self.plan.completion_tokens
        return self.fault.at_token(total) if self.fault else total

    def chunk_counts(self, limit: int) -> Iterator[int]:
        """The generated-token counts below `limit` that get a (non-final) chunk (sim.engine)."""
        return self.steps.chunk_counts(limit, self.stream_interval, self.plan.rng_seed)


class Engine:
    def __init__(self, capacity: Capacity, *, tick: float, prefix_cache: PrefixCache | None = None) -> None:
        self.capacity = capacity
        self.tick = tick
        self.prefix_cache = prefix_cache if prefix_cache is not None else PrefixCache(0)
        self.prefill_lane = PrefillLane(capacity, self.prefix_cache)

    async def run(self, generation: Generation, out: Responder, control: RequestControl) -> None:
        """Serve one generation to its finish, its fault, or its abort (`control`, which frees the
        slot at once; cancelling the task frees it too)."""
        if generation.stream:
            # Headers go out before the slot, like SGLang: a queued stream is a silent 200.
            await out.open_stream()
        prefilled = False
        if await control.take_slot(KvClaim(generation.prompt_tokens, generation.max_new_tokens)):
            try:
                prefilled = await self._prefill(generation, control)
                if not control.aborted:
                    clock = DecodeClock(self.capacity, self.tick, control)
                    control.start_decoding(clock, generation.end)
                    decode = self._stream if generation.stream else self._respond
                    await decode(generation, clock, out, control)
            finally:
                control.release_slot()
        if control.aborted:
            if prefilled:  # one aborted while waiting (for a slot or a batch) computed nothing
                self._cache_computed(generation, control.decoded)
            await _end_aborted(generation, out, control)

    async def _prefill(self, generation: Generation, control: RequestControl) -> bool:
        """Wait for the request's prefill batch to run (sim.capacity), which caches its prompt
        as it ends; True if a batch took it. An abort cuts the wait short; one in the running batch
        is cached all the same (SGLang finishes the forward pass the request is in)."""
        turn = self.prefill_lane.submit(generation.prompt_ids, generation.prompt_tokens)
        try:
            await control.await_prefill(turn)
        finally:
            turn.withdraw()  # cancelled while queued: leave the queue (a no-op once batched)
        generation.frames.cached_tokens = turn.cached_tokens
        return turn.batched

    def _cache_computed(self, generation: Generation, decoded: int) -> None:
        """Cache what a request that ends after `decoded` tokens computed KV for: its prompt and
        every output id but the last, sampled but never fed back (sim.capacity). Before its
        last bytes go out, as SGLang's scheduler caches before the output reaches the client: a
        client that continues the completion at once finds it."""
        if self.prefix_cache.enabled:
            self.prefix_cache.insert([*generation.prompt_ids, *generation.plan.output_ids[: max(decoded - 1, 0)]])

    def _end(self, generation: Generation, control: RequestControl, served: Served) -> None:
        self._cache_computed(generation, control.decoded)
        control.end(served)

    async def _stream(
        self, generation: Generation, clock: DecodeClock, out: Responder, control: RequestControl
    ) -> None:
        frames, end = generation.frames, generation.end
        fault = generation.fault.kind if generation.fault else None
        corruption = generation.corruption
        # A finish or an abort is itself the last chunk; an error chunk or a stall comes after
        # the regular chunks up to its point. Chunks go out at the scheduler's cadence
        # (sim.engine), every one of them: chunks that fall due in the same wake share a write
        # but are never merged, unlike SGLang's tokenizer manager under backlog, which sends only
        # the newest cumulative chunk or merges queued deltas (`_coalesce_streaming_chunks`,
        # 0.5.23 `managers/tokenizer_manager.py`), so that a test can predict every chunk.
        limit = end + 1 if fault in (FaultKind.ERROR_CHUNK, FaultKind.STALL) else end
        dropped = None
        if corruption is not None and corruption.drop_chunk is not None:
            dropped = corruption.dropped_chunk(list(generation.chunk_counts(limit)))
        counts = generation.chunk_counts(limit)
        upcoming = next(counts, None)
        sent = 0
        batch: list[bytes] = []
        while True:
            if control.aborted:  # checked on waking, before building chunks that would go unsent
                control.struck = _fault_names(None, dropped=dropped is not None and dropped <= sent,
                                              corruption=None, reported=False)
                return
            ready = clock.ready(end)
            if upcoming is not None and upcoming <= ready:
                while upcoming is not None and upcoming <= ready:
                    data = frames.chunk(upcoming)
                    if upcoming != dropped:  # built all the same: the next delta starts after it
                        batch.append(data)
                    sent, upcoming = upcoming, next(counts, None)
                control.record_decoded(sent)
            if ready == end:
                break
            if data := b"".join(batch):  # a chat chunk of marker tokens alone has no event
                await out.write(data)
                control.sent = sent
            batch = []
            await clock.sleep_until(end if upcoming is None else min(upcoming, end))

        control.record_decoded(end)
        if fault is FaultKind.STALL:
            if data := b"".join(batch):
                await out.write(data)
                control.sent = sent
            control.struck = _fault_names(fault, dropped=dropped is not None, corruption=None, reported=False)
            while not control.aborted:  # silent until aborted: by /abort_request, or once the client left
                await control.nap(None)
            return
        last, served = _last_chunk(generation, sent=sent, dropped=dropped is not None)
        self._end(generation, control, served)
        await out.close_stream(b"".join(batch) + last + DONE)
        self.capacity.record_finished()

    async def _respond(
        self, generation: Generation, clock: DecodeClock, out: Responder, control: RequestControl
    ) -> None:
        end = generation.end
        # The scheduler sends a non-streaming request an output every FORCE_STREAM_INTERVAL tokens,
        # and that is when SGLang looks for its client (sim.engine): nap from one to the next.
        output = FORCE_STREAM_INTERVAL
        while (ready := clock.ready(end)) < end and not control.aborted:
            if ready >= output:
                if control.client_gone:
                    control.abort()
                    return
                output = (ready // FORCE_STREAM_INTERVAL + 1) * FORCE_STREAM_INTERVAL
            await clock.sleep_until(min(end, output))
        if control.aborted:
            return
        control.record_decoded(end)
        fault = generation.fault.kind if generation.fault else None
        corruption = generation.corruption
        if fault is FaultKind.STALL:
            control.struck = (fault.value,)
            while not control.aborted:  # silent until aborted
                await control.nap(None)
            return
        faults = _fault_names(fault, dropped=False, corruption=corruption,
                              reported=fault not in (FaultKind.ABORT, FaultKind.ERROR_CHUNK))
        if fault is FaultKind.ABORT:
            response, served = generation.frames.abort_response(), Served(0, None, faults)
        elif fault is FaultKind.ERROR_CHUNK:
            response, served = generation.frames.error_response(), Served(0, None, faults)
        else:
            bias = corruption.count_bias if corruption else 0
            response = (200, generation.frames.body(count_bias=bias))
            served = Served(generation.end, generation.plan.finish_reason, faults)
        self._end(generation, control, served)
        await out.respond(*response)
        self.capacity.record_finished()


def _last_chunk(generation: Generation, *, sent: int, dropped: bool) -> tuple[bytes, Served]:
    """A stream's last chunk: its finish (or a scheduler abort's) at its end, or an error chunk."""
    frames, end, corruption = generation.frames, generation.end, generation.corruption
    fault = generation.fault.kind if generation.fault else None
    faults = _fault_names(fault, dropped=dropped, corruption=corruption,
                          reported=fault is not FaultKind.ERROR_CHUNK and frames.counts_in_stream)
    if fault is FaultKind.ERROR_CHUNK:
        return frames.error_chunk(), Served(sent, None, faults)
    finish = abort_finish() if fault is FaultKind.ABORT else generation.plan.finish_reason
    bias = corruption.count_bias if corruption else 0
    return frames.chunk(end, finish=finish, count_bias=bias), Served(end, finish, faults)


async def _end_aborted(generation: Generation, out: Responder, control: RequestControl) -> None:
    """An aborted request's last chunk (then [DONE]), or its 200 body: what was decoded by then."""
    decoded, finish = control.decoded_at_abort, control.abort_finish
    if generation.stream:
        data = generation.frames.chunk(decoded, finish=finish) + DONE
    else:
        data = generation.frames.body(finish, generated=decoded)
    control.end(Served(decoded, finish, control.struck))
    if generation.stream:
        await out.close_stream(data)
    else:
        await out.respond(200, data)


def _fault_names(
    fault: FaultKind | None, *, dropped: bool, corruption: Corruption | None, reported: bool
) -> tuple[str, ...]:
    """What struck a response: its fault, a chunk it lost, a miscount (where a count was sent)."""
    names = [fault.value] if fault is not None else []
    if dropped:
        names.append("drop_chunk")
    if reported and corruption is not None and corruption.miscount:
        names.append("miscount")
    return tuple(names)
