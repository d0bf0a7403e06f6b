"""The simulator's capacity model over real HTTP: open streams are counted running and freed when
their clients leave, --max-running makes requests wait, decode speed falls with load."""
from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx
import pytest
from helpers.sim_plans import plan
from helpers.sim_process import SimProcess
from helpers.waits import wait_until

from genfleet.sim.completion import LengthModel


async def _open_streams(url: str, payload: dict[str, Any], count: int, stack: contextlib.AsyncExitStack):
    client = await stack.enter_async_context(httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=None)))
    return [await stack.enter_async_context(client.stream("POST", url, json=payload)) for _ in range(count)]


def test_open_streams_are_counted_running_and_freed_when_their_clients_disconnect(prompt):
    slow = ("--rate", "20", "--length-median", "100", "--length-mean", "101")
    payload = {"input_ids": prompt, "stream": True}

    async def scenario(sim: SimProcess) -> None:
        async with contextlib.AsyncExitStack() as stack:
            responses = await _open_streams(f"{sim.url}/generate", payload, 12, stack)
            readers = [response.aiter_bytes() for response in responses]  # dropping one closes its stream
            for reader in readers:
                assert (await anext(reader)).startswith(b"data: ")
            stats = sim.stats()
            assert (stats["running"], stats["peak_running"], stats["requests_started"]) == (12, 12, 12)

    with SimProcess(*slow) as sim:
        asyncio.run(scenario(sim))
        # SGLang aborts a stream whose client left 2 s later (`create_abort_task`): held till then.
        assert sim.stats()["running"] == 12
        wait_until(lambda: sim.stats()["running"] == 0, timeout=4)
        stats = sim.stats()
        assert stats["requests_disconnected"] == 12 and stats["requests_finished"] == 0
        assert 0 < stats["mean_running"] <= 12


def test_max_running_makes_further_requests_wait(prompt):
    payload = {"input_ids": prompt, "stream": True}

    async def scenario(sim: SimProcess) -> None:
        async with contextlib.AsyncExitStack() as stack:
            await _open_streams(f"{sim.url}/generate", payload, 5, stack)
            await asyncio.to_thread(wait_until, lambda: sim.stats()["waiting"] == 3)
            assert sim.stats()["running"] == 2

    # --disconnect-abort-s 0: this test is about waiting, not about how long a left stream decodes on.
    with SimProcess("--rate", "20", "--max-running", "2", "--disconnect-abort-s", "0") as sim:
        asyncio.run(scenario(sim))
        wait_until(lambda: (sim.stats()["running"], sim.stats()["waiting"]) == (0, 0), timeout=2)


def test_decode_speed_falls_as_more_requests_run(prompt, vocab):
    """Four at once with knee 4 each decode at rate / 2, so the same completion takes twice as long."""
    flags = ("--rate", "200", "--knee", "4", "--length-median", "60", "--length-mean", "61")
    tokens = plan(prompt, vocab, lengths=LengthModel(median=60, mean=61)).completion_tokens

    async def timed(url: str, count: int) -> list[float]:
        async with httpx.AsyncClient(timeout=30) as client:
            async def one() -> float:
                response = await client.post(url, json={"input_ids": prompt})
                return response.json()["meta_info"]["e2e_latency"]

            return await asyncio.gather(*(one() for _ in range(count)))

    with SimProcess(*flags) as sim:
        alone = asyncio.run(timed(f"{sim.url}/generate", 1))[0]
        together = asyncio.run(timed(f"{sim.url}/generate", 4))
        sim.reset_stats()
        assert sim.stats()["requests_finished"] == 0
    # First token with prefill, then (tokens - 1) at 200 / (1 + 1/4) = 160 tok/s, or 100 tok/s.
    assert alone == pytest.approx((tokens - 1) / 160, abs=0.06)
    assert max(together) == pytest.approx((tokens - 1) / 100, abs=0.08)
    assert min(together) > (tokens - 1) / 100 - 0.02
