"""A simulated server in process: the ASGI app behind an httpx client (no sockets, no subprocess),
for tests that look inside it (its capacity, its prefill lane) while requests run."""
from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx

from genfleet.sim.command import parse_sim_args
from genfleet.sim.server import SimServer


@contextlib.asynccontextmanager
async def served(*flags: str) -> AsyncIterator[tuple[SimServer, httpx.AsyncClient]]:
    """A server started with `genfleet sim` flags, and a client for it."""
    server = SimServer(parse_sim_args(flags))
    transport = httpx.ASGITransport(app=server)
    async with httpx.AsyncClient(transport=transport, base_url="http://sim", timeout=30) as client:
        yield server, client


async def generate(
    client: httpx.AsyncClient, ids: list[int], rid: str | None = None, **sampling_params: object
) -> dict:
    """One non-streaming /generate, which must answer 200: its body."""
    body: dict[str, object] = {"input_ids": ids, "sampling_params": sampling_params}
    if rid is not None:
        body["rid"] = rid
    response = await client.post("/generate", json=body)
    assert response.status_code == 200, response.text
    return response.json()
