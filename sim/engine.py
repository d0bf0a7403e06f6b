"""The simulated scheduler: one request's slot, its turn in the server's prefill lane, which
prefills what the prefix cache lacks (sim.prefill_lane, sim.prefix_cache), paced decode, chunk
cadence, fault and abort (sim.aborts)."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from genfleet.sim.aborts import FORCE_STREAM_INTERVAL, RequestControl
from genfleet.sim.capacity import Capacity
from genfleet.sim.chunking import DecodeSteps
from genfleet.sim.completion import CompletionPlan
from genfleet.sim.decode_clock import DecodeClock
from genfleet.sim.faults import Corruption, Fault, FaultKind
from genfleet.sim.prefill_lane import PrefillLane
from genfleet.sim.prefix_cache import PrefixCache
from genfleet.sim.wire import DONE, abort_finish


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
        """The generated-token counts below `limit` that get a (non-final) chunk (sim.chunking)."""
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
        if await control.take_slot():
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
        """Wait for the request's prefill batch to run (sim.prefill_lane), which caches its prompt
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
        every output id but the last, sampled but never fed back (sim.prefix_cache). Before its
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
        # (sim.chunking), every one of them: chunks that fall due in the same wake share a write
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
        # and that is when SGLang looks for its client (sim.aborts): nap from one to the next.
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
