"""Running a simulated server in the foreground: uvicorn, the start line, and --die-after."""
from __future__ import annotations

import asyncio
import os
import socket
import sys
from types import FrameType

import uvicorn

from genfleet.sim.server import SimServer
from genfleet.sim.settings import SimSettings

GRACEFUL_SHUTDOWN_S = 2.0  # stalled streams never end by themselves


def serve(settings: SimSettings) -> None:
    """Run a simulated server until interrupted."""
    sim = SimServer(settings)
    config = uvicorn.Config(
        sim,
        interface="asgi3",
        host=settings.host,
        port=settings.port,
        loop="auto",  # uvloop and httptools when installed
        http="auto",
        lifespan="off",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    try:
        _SimUvicorn(config, sim).run()
    finally:
        if sim.log is not None:
            sim.log.close()


class _SimUvicorn(uvicorn.Server):
    """uvicorn that flags the shutdown for /health, and can die on schedule."""

    def __init__(self, config: uvicorn.Config, sim: SimServer) -> None:
        super().__init__(config)
        self.sim = sim
        self._loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if not self.started:
            return
        self._loop = asyncio.get_running_loop()
        settings = self.sim.settings
        print(f"sim listening on {settings.url} ({settings.describe()})", flush=True)
        if settings.faults.die_after is not None:
            asyncio.get_running_loop().call_later(settings.faults.die_after, _die, settings.faults.die_after)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.sim.shutting_down = True
        if self._loop is not None:  # a signal handler: the loop runs the aborts, between its callbacks
            self._loop.call_soon_threadsafe(self.sim.generation.in_flight.abort_left)
        super().handle_exit(sig, frame)


def _die(after: float) -> None:
    print(f"sim: dying abruptly, as --die-after {after:g} asked", file=sys.stderr, flush=True)
    os._exit(1)  # no cleanup, no goodbye: a crashed host
