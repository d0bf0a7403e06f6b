"""The simulated scheduler: one request's slot, prefill, paced decode, chunk cadence and fault."""
from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from sim.capacity import Capacity
from sim.chunking import DecodeSteps
from sim.completion import CompletionPlan
from sim.faults import Corruption, Fault, FaultKind
from sim.wire import DONE, abort_finish


class Responder(Protocol):
    """Where a generation's bytes go: one JSON response, or an SSE stream written piecewise."""

    async def respond(self, status: int, body: bytes) -> None: ...

    async def open_stream(self) -> None: ...

    async def write(self, data: bytes) -> None: ...

    async def close_stream(self, data: bytes) -> None: ...


class Frames(Protocol):
    """One API's bytes for a generation (`/generate`'s or the chat API's), at any token count."""

    def chunk(self, generated: int, *, finish: dict[str, Any] | None = None, count_bias: int = 0) -> bytes:
        """The stream's events after `generated` tokens (maybe none); `finish` marks the last;
        `count_bias` is added to the completion_tokens the last one reports."""
        ...

    def body(self, finish: dict[str, Any] | None = None, *, count_bias: int = 0) -> bytes: ...

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
    corruption: Corruption | None = None
    # Called as the last bytes of the response go out (never for a stall, nor for a client that
    # left before them).
    on_served: Callable[[Served], None] | None = None

    @property
    def end(self) -> int:
        """The generated-token count at which the request ends, by finishing or by its fault."""
        total = self.plan.completion_tokens
        return self.fault.at_token(total) if self.fault else total

    def chunk_counts(self, limit: int) -> Iterator[int]:
        """The generated-token counts below `limit` that get a (non-final) chunk (sim.chunking)."""
        return self.steps.chunk_counts(limit, self.stream_interval, self.plan.rng_seed)


class Engine:
    def __init__(self, capacity: Capacity, *, tick: float) -> None:
        self.capacity = capacity
        self.tick = tick

    async def run(self, generation: Generation, out: Responder) -> None:
        """Serve one generation; cancel the task to abort it (the slot is freed at once)."""
        if generation.stream:
            # Headers go out before the slot, like SGLang: a queued stream is a silent 200.
            await out.open_stream()
        await self.capacity.acquire()
        try:
            await asyncio.sleep(self.capacity.prefill_seconds(generation.prompt_tokens))
            clock = _DecodeClock(self.capacity, self.tick)
            if generation.stream:
                await self._stream(generation, clock, out)
            else:
                await self._respond(generation, clock, out)
        finally:
            self.capacity.release()

    async def _stream(self, generation: Generation, clock: _DecodeClock, out: Responder) -> None:
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
            ready = clock.ready(end)
            if upcoming is not None and upcoming <= ready:
                before = sent
                while upcoming is not None and upcoming <= ready:
                    data = frames.chunk(upcoming)
                    if upcoming != dropped:  # built all the same: the next delta starts after it
                        batch.append(data)
                    sent, upcoming = upcoming, next(counts, None)
                self.capacity.record_tokens(sent - before)
            if ready == end:
                break
            if data := b"".join(batch):  # a chat chunk of marker tokens alone has no event
                await out.write(data)
            batch = []
            await clock.sleep_until(end if upcoming is None else min(upcoming, end))

        self.capacity.record_tokens(end - sent)
        if fault is FaultKind.STALL:
            if data := b"".join(batch):
                await out.write(data)
            await _silence()
        faults = _fault_names(fault, dropped=dropped is not None, corruption=corruption,
                              reported=fault is not FaultKind.ERROR_CHUNK and frames.counts_in_stream)
        if fault is FaultKind.ERROR_CHUNK:
            batch.append(frames.error_chunk())
            served = Served(sent, None, faults)
        else:
            finish = abort_finish() if fault is FaultKind.ABORT else generation.plan.finish_reason
            bias = corruption.count_bias if corruption else 0
            batch.append(frames.chunk(end, finish=finish, count_bias=bias))
            served = Served(end, finish, faults)
        batch.append(DONE)
        if generation.on_served is not None:  # before the last bytes: a client that saw them finds the line
            generation.on_served(served)
        await out.close_stream(b"".join(batch))
        self.capacity.record_finished()

    async def _respond(self, generation: Generation, clock: _DecodeClock, out: Responder) -> None:
        while clock.ready(generation.end) < generation.end:
            await clock.sleep_until(generation.end)
        self.capacity.record_tokens(generation.end)
        fault = generation.fault.kind if generation.fault else None
        corruption = generation.corruption
        if fault is FaultKind.STALL:
            await _silence()
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
        if generation.on_served is not None:  # before the response: a client that has it finds the line
            generation.on_served(served)
        await out.respond(*response)
        self.capacity.record_finished()


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


class _DecodeClock:
    """One request's generated-token count, read off the shared decode clock, and its naps."""

    def __init__(self, capacity: Capacity, tick: float) -> None:
        self._capacity = capacity
        # The first token comes out of prefill, so the request starts one token in.
        self._origin = capacity.progress() - 1.0
        self._tick = tick
        # Held, not looked up per nap: asyncio.get_running_loop() costs a getpid() syscall on
        # Python 3.11, and streams nap thousands of times a second.
        self._loop = asyncio.get_running_loop()

    def ready(self, limit: int) -> int:
        # The epsilon keeps rounding in `origin` from holding back a token that is due.
        return min(limit, math.floor(self._capacity.progress() - self._origin + 1e-9))

    async def sleep_until(self, count: int) -> None:
        """Sleep until `count` tokens are due if `running` holds, but at least a tick: waking per
        token would burn the CPU the clients need. The caller re-reads `ready` on waking."""
        delay = max(self._tick, self._capacity.seconds_until(self._origin + count))
        woken = self._loop.create_future()
        timer = self._loop.call_later(delay, _wake, woken)
        try:
            await woken
        finally:
            timer.cancel()


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _silence() -> None:
    """A stalled request: holds its slot until the client disconnects and the task is cancelled."""
    await asyncio.get_running_loop().create_future()
