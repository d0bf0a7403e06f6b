"""The simulated scheduler: one request's slot, prefill, paced decode, chunk cadence and fault."""
from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any, Protocol

from sim.capacity import Capacity
from sim.completion import CompletionPlan
from sim.faults import Fault, FaultKind
from sim.wire import DONE, abort_finish


class Responder(Protocol):
    """Where a generation's bytes go: one JSON response, or an SSE stream written piecewise."""

    async def respond(self, status: int, body: bytes) -> None: ...

    async def open_stream(self) -> None: ...

    async def write(self, data: bytes) -> None: ...

    async def close_stream(self, data: bytes) -> None: ...


class Frames(Protocol):
    """One API's bytes for a generation (`/generate`'s or the chat API's), at any token count."""

    def chunk(self, generated: int, *, finish: dict[str, Any] | None = None) -> bytes:
        """The stream's events after `generated` tokens (maybe none); `finish` marks the last."""
        ...

    def body(self, finish: dict[str, Any] | None = None) -> bytes: ...

    def error_chunk(self) -> bytes: ...

    def abort_response(self) -> tuple[int, bytes]: ...

    def error_response(self) -> tuple[int, bytes]: ...


@dataclass(frozen=True)
class Generation:
    """A validated request, its planned completion and its fate."""

    plan: CompletionPlan
    frames: Frames
    prompt_tokens: int
    stream: bool
    stream_interval: int
    fault: Fault | None

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
            clock = _DecodeClock(self.capacity, self.tick)
            if generation.stream:
                await self._stream(generation, clock, out)
            else:
                await self._respond(generation, clock, out)
        finally:
            self.capacity.release()

    async def _stream(self, generation: Generation, clock: _DecodeClock, out: Responder) -> None:
        frames, end, interval = generation.frames, generation.end, generation.stream_interval
        fault = generation.fault.kind if generation.fault else None
        # A finish or an abort is itself the last chunk; an error chunk or a stall comes after
        # the regular chunks up to its point.
        last_regular = end if fault in (FaultKind.ERROR_CHUNK, FaultKind.STALL) else end - 1
        sent = 0
        batch: list[bytes] = []
        while True:
            ready = clock.ready(end)
            counts = chunk_counts(sent, min(ready, last_regular), interval)
            if counts:
                batch = [frames.chunk(count) for count in counts]
                self.capacity.record_tokens(counts[-1] - sent)
                sent = counts[-1]
            if ready == end:
                break
            if data := b"".join(batch):  # a chat chunk of marker tokens alone has no event
                await out.write(data)
            batch = []
            await clock.sleep_until(min(sent + interval if sent else 1, end))

        self.capacity.record_tokens(end - sent)
        if fault is FaultKind.STALL:
            if data := b"".join(batch):
                await out.write(data)
            await _silence()
        if fault is FaultKind.ERROR_CHUNK:
            batch.append(frames.error_chunk())
        else:
            finish = abort_finish() if fault is FaultKind.ABORT else generation.plan.finish_reason
            batch.append(frames.chunk(end, finish=finish))
        batch.append(DONE)
        await out.close_stream(b"".join(batch))
        self.capacity.record_finished()

    async def _respond(self, generation: Generation, clock: _DecodeClock, out: Responder) -> None:
        while clock.ready(generation.end) < generation.end:
            await clock.sleep_until(generation.end)
        self.capacity.record_tokens(generation.end)
        fault = generation.fault.kind if generation.fault else None
        if fault is FaultKind.STALL:
            await _silence()
        if fault is FaultKind.ABORT:
            await out.respond(*generation.frames.abort_response())
        elif fault is FaultKind.ERROR_CHUNK:
            await out.respond(*generation.frames.error_response())
        else:
            await out.respond(200, generation.frames.body())
        self.capacity.record_finished()


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
