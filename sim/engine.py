"""The simulated scheduler: one request's slot, prefill, paced decode, chunk cadence and fault."""
from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Protocol

from sim.capacity import Capacity
from sim.completion import CompletionPlan
from sim.faults import ErrorFormat, Fault, FaultKind
from sim.wire import (
    CUDA_ERROR,
    DONE,
    QUEUE_FULL,
    CompletionFrames,
    abort_finish,
    http_exception_body,
    internal_error_chunk,
    message_error_body,
)


class Responder(Protocol):
    """Where a generation's bytes go: one JSON response, or an SSE stream written piecewise."""

    async def respond(self, status: int, body: bytes) -> None: ...

    async def open_stream(self) -> None: ...

    async def write(self, data: bytes) -> None: ...

    async def close_stream(self, data: bytes) -> None: ...


@dataclass(frozen=True)
class Generation:
    """A validated request, its planned completion and its fate."""

    plan: CompletionPlan
    frames: CompletionFrames
    prompt_tokens: int
    stream: bool
    stream_interval: int
    fault: Fault | None
    error_format: ErrorFormat

    @property
    def end(self) -> int:
        """The generated-token count at which the request ends, by finishing or by its fault."""
        total = self.plan.completion_tokens
        return self.fault.at_token(total) if self.fault else total


def chunk_counts(sent: int, ready: int, interval: int) -> range:
    """Token counts in (sent, ready] that get a chunk: the first token, then every `interval` unsent.

    `sent` is always one of these counts (or 0), as SGLang's output streamer flushes on them.
    """
    return range(1 if sent == 0 else sent + interval, ready + 1, interval)


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
            # The first token comes out of prefill, so the clock starts one token in.
            clock = _DecodeClock(self.capacity, origin=self.capacity.progress() - 1.0, tick=self.tick)
            if generation.stream:
                await self._stream(generation, clock, out)
            else:
                await self._respond(generation, clock, out)
        finally:
            self.capacity.release()

    async def _stream(self, generation: Generation, clock: _DecodeClock, out: Responder) -> None:
        frames, end, interval = generation.frames, generation.end, generation.stream_interval
        fault = generation.fault.kind if generation.fault else None
        # A finish or an abort is itself the last chunk; an error chunk or a stall follows the
        # regular chunks up to its point.
        last_regular = end if fault in (FaultKind.ERROR_CHUNK, FaultKind.STALL) else end - 1
        sent = 0
        while True:
            ready = min(end, clock.ready())
            counts = chunk_counts(sent, min(ready, last_regular), interval)
            batch = [frames.chunk(count, first=sent == 0 and i == 0) for i, count in enumerate(counts)]
            if counts:
                self.capacity.record_tokens(counts[-1] - sent)
                sent = counts[-1]
            if ready == end:
                break
            if batch:
                await out.write(b"".join(batch))
            next_count = chunk_counts(sent, end, interval)
            await clock.wait_for(next_count[0] if next_count else end)

        self.capacity.record_tokens(end - sent)
        if fault is FaultKind.STALL:
            if batch:
                await out.write(b"".join(batch))
            await _silence()
        if fault is FaultKind.ERROR_CHUNK:
            batch.append(internal_error_chunk(generation.error_format))
        else:
            finish = abort_finish() if fault is FaultKind.ABORT else generation.plan.finish_reason
            batch.append(frames.chunk(end, first=sent == 0, finish=finish))
        batch.append(DONE)
        await out.close_stream(b"".join(batch))
        self.capacity.record_finished()

    async def _respond(self, generation: Generation, clock: _DecodeClock, out: Responder) -> None:
        await clock.wait_for(generation.end)
        self.capacity.record_tokens(generation.end)
        fault = generation.fault.kind if generation.fault else None
        if fault is FaultKind.STALL:
            await _silence()
        if fault is FaultKind.ABORT:
            await out.respond(503, http_exception_body(QUEUE_FULL, 503))
        elif fault is FaultKind.ERROR_CHUNK:
            await out.respond(500, message_error_body(CUDA_ERROR))
        else:
            await out.respond(200, generation.frames.body())
        self.capacity.record_finished()


class _DecodeClock:
    """How many tokens one request has generated, read off the shared decode clock."""

    def __init__(self, capacity: Capacity, *, origin: float, tick: float) -> None:
        self._capacity = capacity
        self._origin = origin
        self._tick = tick

    def ready(self) -> int:
        return math.floor(self._capacity.progress() - self._origin)

    async def wait_for(self, count: int) -> None:
        # Sleep at least a tick: waking per token would burn the CPU the clients need.
        while self.ready() < count:
            await asyncio.sleep(max(self._tick, self._capacity.seconds_until(self._origin + count)))


async def _silence() -> None:
    """A stalled request: holds its slot until the client disconnects and the task is cancelled."""
    await asyncio.get_running_loop().create_future()
