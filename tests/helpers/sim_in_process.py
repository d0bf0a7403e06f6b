"""A simulated server in process: the ASGI app behind an httpx client (no sockets, no subprocess),
for tests that look inside it (its capacity, its prefill lane) while requests run; and the settings
`genfleet sim` flags give, parsed by the same typer command, for tests that predict a server's output."""
from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence

import httpx
import typer

from genfleet.sim.command import sim_settings
from genfleet.sim.server import SimServer
from genfleet.sim.settings import SimSettings


def parse_sim_args(args: Sequence[str]) -> SimSettings:
    """The settings `genfleet sim ARGS` would serve with, without serving: a test gives the same
    flags it starts a server with and predicts its completions (`SimSettings.plan`) and chunks
    (`SimSettings.stream_counts`). `--port` may be left out."""
    args = list(args)
    if "--port" not in args and not any(arg.startswith("--port=") for arg in args):
        args += ["--port", "0"]
    app = typer.Typer(add_completion=False)
    app.command()(sim_settings)  # the options `genfleet sim` has: its `sim_command` wraps this function
    return typer.main.get_command(app).main(args=args, standalone_mode=False)


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
