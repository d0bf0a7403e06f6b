"""One request's generated-token count, read off the shared decode clock (sim.capacity), and its naps.

The clock stands still while a prefill batch runs (sim.prefill_lane), so a request's tokens come
out later when other requests are prefilled; a nap is the clock's own estimate, re-checked on waking.
"""
from __future__ import annotations

import math

from genfleet.sim.aborts import RequestControl
from genfleet.sim.capacity import Capacity


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
