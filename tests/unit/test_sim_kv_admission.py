"""The sim's KV cache admits by reservation, as SGLang 0.5.23's PrefillAdder does (sim.capacity):
a generous cap keeps requests waiting while the cache is mostly empty; a small one admits more."""
from __future__ import annotations

import asyncio

import pytest
import typer
from helpers.sim_in_process import generate, parse_sim_args, served

from genfleet.sim.capacity import CLIP_MAX_NEW_TOKENS, Capacity, CapacitySettings, KvClaim


def admitted(max_total_tokens: int, claims: list[KvClaim], ratio: float = 0.5) -> int:
    """How many of `claims`, asked at once, run before any decodes."""
    capacity = Capacity(CapacitySettings(max_total_tokens=max_total_tokens, new_token_ratio=ratio), clock=lambda: 0.0)

    async def scenario() -> int:
        waits = [asyncio.ensure_future(capacity.acquire(claim)) for claim in claims]
        await asyncio.sleep(0)
        for wait in waits:
            wait.cancel()
        return capacity.running

    return asyncio.run(scenario())


def test_a_request_needs_its_whole_clipped_cap_and_the_running_ones_a_share_of_theirs():
    # Each holds 100 + 0.5 x 1,000 = 600 once running; a newcomer needs 100 + 1,000 = 1,100.
    claims = [KvClaim(100, 1000) for _ in range(20)]
    assert admitted(1100, claims) == 1  # an empty cache takes the first whatever it asks
    assert admitted(1700, claims) == 2  # 600 + 1,100
    assert admitted(1699, claims) == 1
    assert admitted(6000, claims) == 9  # 8 x 600 + 1,100 = 5,900; 9 x 600 + 1,100 = 6,500
    # A cap beyond SGLang's estimation clip reserves as the clip does.
    assert admitted(6000, [KvClaim(100, 10_240) for _ in range(5)]) == admitted(
        6000, [KvClaim(100, CLIP_MAX_NEW_TOKENS) for _ in range(5)])


def test_a_smaller_cap_admits_more_of_the_same_requests():
    big, small = ([KvClaim(200, cap) for _ in range(150)] for cap in (4000, 400))
    assert admitted(16_384, small) > 5 * admitted(16_384, big)


def test_a_request_that_ends_gives_its_room_to_the_next_in_line():
    capacity = Capacity(CapacitySettings(max_total_tokens=1100, new_token_ratio=0.5), clock=lambda: 0.0)
    first, second = KvClaim(100, 1000), KvClaim(100, 1000)

    async def scenario() -> tuple[int, int, int]:
        await capacity.acquire(first)
        waiting = asyncio.ensure_future(capacity.acquire(second))
        await asyncio.sleep(0)
        before = (capacity.running, capacity.waiting)
        capacity.release(first)
        await waiting
        return (*before, capacity.running)

    assert asyncio.run(scenario()) == (1, 1, 1)


def test_a_waiting_request_that_leaves_lets_a_smaller_one_behind_it_in():
    capacity = Capacity(CapacitySettings(max_total_tokens=1700, new_token_ratio=0.5), clock=lambda: 0.0)

    async def scenario() -> int:
        await capacity.acquire(KvClaim(100, 1000))  # holds 600
        big = asyncio.ensure_future(capacity.acquire(KvClaim(100, 4000)))  # needs 4,100: waits
        small = asyncio.ensure_future(capacity.acquire(KvClaim(100, 500)))  # FCFS: waits behind it
        await asyncio.sleep(0)
        assert capacity.waiting == 2
        big.cancel()
        await small
        return capacity.running

    assert asyncio.run(scenario()) == 2


def test_loads_report_the_kv_cache_and_the_share_held(prompt):
    flags = ("--max-total-tokens", "3000", "--new-token-ratio", "0.5", "--length-tokens", "200:200",
             "--rate", "50", "--tick", "0.005")

    async def scenario() -> tuple[dict, list[dict]]:
        async with served(*flags) as (server, client):
            streams = [asyncio.ensure_future(generate(client, prompt, max_new_tokens=2000)) for _ in range(4)]
            while server.capacity.running == 0:
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.2)
            load = (await client.get("/v1/loads")).json()["loads"][0]
            return load, await asyncio.gather(*streams)

    load, answers = asyncio.run(scenario())
    # 2,000-token caps in a 3,000-token cache: one runs (a second would need its 2,000 beside the
    # first's ~1,000 held and reserved), three wait, and the one running holds a small share.
    assert (load["num_running_reqs"], load["num_waiting_reqs"], load["max_total_num_tokens"]) == (1, 3, 3000)
    assert 0 < load["token_usage"] < 0.2
    assert all(answer["meta_info"]["completion_tokens"] == 200 for answer in answers)


def test_the_ratio_falls_each_decode_step_to_its_floor_and_starts_again_after_idle():
    # SGLang 0.5.23 `new_token_ratio_tracker.py`: 0.7 falls by (0.7 - 0.098) / 600 per decode step.
    now = [0.0]
    capacity = Capacity(CapacitySettings(rate=100, knee=1e9, max_total_tokens=10_000), clock=lambda: now[0])
    first, second = KvClaim(100, 4000), KvClaim(100, 4000)

    async def scenario() -> list[float]:
        ratios = []
        await capacity.acquire(first)
        for seconds in (0.0, 3.0, 6.0, 10.0):  # 100 decode steps a second
            now[0] = seconds
            ratios.append(capacity.new_token_ratio())
        capacity.release(first)  # idle
        now[0] = 20.0
        await capacity.acquire(second)
        ratios.append(capacity.new_token_ratio())
        return ratios

    assert [round(r, 4) for r in asyncio.run(scenario())] == [0.7, 0.399, 0.098, 0.098, 0.7]


def test_a_busy_server_admits_a_waiting_request_once_the_ratio_has_fallen():
    # The first holds 100 + 0.7 x 4,000 = 2,900 at the start, so a newcomer's 4,100 does not fit
    # in 6,000; 600 decode steps later it holds 100 + 600 + 0.098 x 3,400 = 1,033, and it does,
    # with no request ending: what makes a busy SGLang admit by the KV in use, not the caps.
    now = [0.0]
    capacity = Capacity(CapacitySettings(rate=100, knee=1e9, max_total_tokens=6000), clock=lambda: now[0])

    async def scenario() -> tuple[int, int]:
        await capacity.acquire(KvClaim(100, 4000))
        second = asyncio.ensure_future(capacity.acquire(KvClaim(100, 4000)))
        await asyncio.sleep(0.05)
        before = capacity.running
        now[0] = 6.0
        await asyncio.wait_for(second, timeout=5)
        return before, capacity.running

    assert asyncio.run(scenario()) == (1, 2)


def test_the_sim_reads_sglangs_own_variables_for_the_ratio_and_names_a_bad_one(monkeypatch):
    monkeypatch.setenv("SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS", "75")
    monkeypatch.setenv("SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR", "0.2")
    capacity = parse_sim_args([]).capacity
    assert (capacity.new_token_ratio_decay_steps, capacity.min_new_token_ratio_factor) == (75, 0.2)
    monkeypatch.setenv("SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS", "many")
    with pytest.raises(typer.BadParameter, match="SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS"):
        parse_sim_args([])
