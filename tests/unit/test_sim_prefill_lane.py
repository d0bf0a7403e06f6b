"""The server's prefill lane (sim.capacity): a prefill batch stops everyone's decoding for as long
as it runs, and aborts of requests queued for it or inside it end as SGLang's would."""
from __future__ import annotations

import asyncio
import time

import pytest
from helpers.sim_in_process import generate, served

from genfleet.sim.capacity import Capacity, CapacitySettings
from genfleet.sim.engine import ABORTED, ABORTED_WHILE_WAITING

LONG = list(range(5000, 6000))  # a prompt no other test prompt shares


def test_the_decode_clock_stands_still_while_a_prefill_batch_runs():
    now = [0.0]
    capacity = Capacity(CapacitySettings(rate=100, knee=1), clock=lambda: now[0])

    async def scenario() -> None:
        await capacity.acquire()  # one running: 100 / (1 + 1) = 50 tok/s
        now[0] = 1.0
        capacity.pause_decoding(2.0)
        assert capacity.decode_rate() == 0.0
        now[0] = 2.0
        assert capacity.progress() == pytest.approx(50.0)
        # The rest of the pause (1 s), then 50 tokens at 50 tok/s.
        assert capacity.seconds_until(100.0) == pytest.approx(2.0)
        now[0] = 3.5  # the pause ended at 3.0, with no call at that moment
        assert capacity.progress() == pytest.approx(75.0)
        assert capacity.decode_rate() == pytest.approx(50.0)

    asyncio.run(scenario())
    stats = capacity.stats()
    assert (stats.prefill_batches, stats.prefill_busy_s) == (1, pytest.approx(2.0))


def test_a_prefill_pauses_the_decoding_of_running_requests(prompt):
    # 100 tok/s whatever the load; 1,000 uncached tokens take 0.5 s at 2,000 tok/s.
    flags = ("--page-size", "1", "--prefill-rate", "2000", "--rate", "100", "--knee", "1000000",
             "--length-tokens", "40:40", "--tick", "0.005")

    async def scenario() -> tuple[dict, dict, dict]:
        async with served(*flags) as (server, client):
            first = asyncio.ensure_future(generate(client, prompt))
            while not server.capacity.stats().prefill_batches:
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.1)  # the first decodes
            long = await generate(client, LONG, max_new_tokens=1)
            return await first, long, (await client.get("/sim/stats")).json()

    first, long, stats = asyncio.run(scenario())
    own_prefill_s, pause_s, decode_s = len(prompt) / 2000, len(LONG) / 2000, 39 / 100
    assert long["meta_info"]["e2e_latency"] >= pause_s
    # Its first token came out of its prefill; the other 39 took 0.39 s of decoding, and 0.5 s more
    # while the long prompt was prefilled.
    assert own_prefill_s + decode_s + pause_s - 0.02 <= first["meta_info"]["e2e_latency"]
    assert first["meta_info"]["e2e_latency"] < own_prefill_s + decode_s + pause_s + 0.15
    assert (stats["prefill_batches"], stats["prefill_busy_s"]) == (2, pytest.approx(own_prefill_s + pause_s))


# 1,000 uncached tokens take 0.3 s; short completions decode fast.
SLOW_PREFILL = ("--page-size", "1", "--prefill-rate", "3333", "--rate", "100000", "--length-tokens", "20:30",
                "--tick", "0.001")


def test_a_request_aborted_while_queued_for_prefill_ends_as_waiting_and_computes_nothing(prompt):
    async def scenario() -> tuple[dict, dict, dict]:
        async with served(*SLOW_PREFILL) as (server, client):
            blocker = asyncio.ensure_future(generate(client, LONG, max_new_tokens=1))
            while not server.capacity.stats().prefill_batches:  # the lane is busy with it
                await asyncio.sleep(0.005)
            queued = asyncio.ensure_future(generate(client, prompt, rid="queued"))
            while not server.generation.engine.prefill_lane.queued:
                await asyncio.sleep(0.005)
            await client.post("/abort_request", json={"rid": "queued"})
            aborted = await queued
            await blocker
            again = await generate(client, prompt)
            return aborted, again, (await client.get("/sim/stats")).json()

    aborted, again, stats = asyncio.run(scenario())
    assert aborted["meta_info"]["finish_reason"] == ABORTED_WHILE_WAITING and aborted["output_ids"] == []
    # Never prefilled: the same prompt later finds nothing cached, and only two prompts were counted.
    assert again["meta_info"]["cached_tokens"] == 0
    assert (stats["prefill_batches"], stats["prompt_tokens_total"]) == (2, len(LONG) + len(prompt))


def test_a_request_aborted_in_the_running_batch_ends_at_once_but_its_prompt_is_cached_after_the_batch():
    async def scenario() -> tuple[dict, float, dict, float]:
        async with served(*SLOW_PREFILL) as (server, client):
            started = time.monotonic()
            batched = asyncio.ensure_future(generate(client, LONG, rid="batched"))
            while not server.capacity.stats().prefill_batches:
                await asyncio.sleep(0.005)
            await client.post("/abort_request", json={"rid": "batched"})
            aborted = await batched
            aborted_after = time.monotonic() - started
            again = await generate(client, LONG)  # waits for the batch to run its course
            return aborted, aborted_after, again, time.monotonic() - started

    aborted, aborted_after, again, again_after = asyncio.run(scenario())
    batch_s = len(LONG) / 3333
    assert aborted["meta_info"]["finish_reason"] == ABORTED and aborted_after < batch_s - 0.1
    assert again["meta_info"]["cached_tokens"] == len(LONG) - 1
    assert again_after >= batch_s
