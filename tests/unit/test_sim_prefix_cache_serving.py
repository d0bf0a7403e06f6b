"""The prefix cache in a simulated server, in process (the ASGI app, no sockets): what requests
report as cached, what the stats count, that completions do not change, /flush_cache."""
from __future__ import annotations

import asyncio
import json

from helpers.sim_in_process import generate, served

from genfleet.sim.server import SimServer
from genfleet.sim.settings import SimSettings

# Page size 1, so that a hit is exact (len - 1); fast prefill and decode.
EXACT = ("--page-size", "1", "--prefill-rate", "1000000", "--rate", "100000", "--length-tokens", "20:30",
         "--tick", "0.001")
MESSAGES = [{"role": "user", "content": "Name three prime numbers, please."}]


def planned_ids(settings: SimSettings, server: SimServer, ids: list[int], seed: int) -> list[int]:
    return settings.plan(ids, vocab=server.vocab, seed=seed).output_ids


def test_samples_of_one_prompt_hit_the_cache_once_the_first_is_done_and_get_the_same_completions(prompt):
    ids = [*range(1000, 1040), *prompt]

    async def scenario() -> tuple[list[dict], dict, SimServer]:
        async with served(*EXACT) as (server, client):
            first = await generate(client, ids, sampling_seed=0)
            rest = await asyncio.gather(*(generate(client, ids, sampling_seed=seed) for seed in (1, 2, 3)))
            return [first, *rest], (await client.get("/sim/stats")).json(), server

    bodies, stats, server = asyncio.run(scenario())
    cached = [body["meta_info"]["cached_tokens"] for body in bodies]
    assert cached == [0] + [len(ids) - 1] * 3
    assert bodies[0]["meta_info"]["cached_tokens_details"] is None
    assert bodies[1]["meta_info"]["cached_tokens_details"] == {"device": len(ids) - 1, "host": 0}
    for seed, body in enumerate(bodies):  # the cache changes timing and counts, never a completion
        assert body["output_ids"] == planned_ids(server.settings, server, ids, seed)
    assert (stats["prompt_tokens_total"], stats["cached_tokens_total"]) == (4 * len(ids), 3 * (len(ids) - 1))
    assert stats["prefill_tokens_computed"] == len(ids) + 3


def test_a_sample_sent_while_the_first_decodes_finds_the_prompt_cached_after_its_prefill(prompt):
    slow = ("--page-size", "1", "--prefill-rate", "1000000", "--rate", "50", "--length-tokens", "20:20")

    async def scenario() -> list[int]:
        async with served(*slow) as (server, client):
            first = asyncio.ensure_future(generate(client, prompt, sampling_seed=0))
            while not server.capacity.stats().prompt_tokens_total:  # the first's prefill began
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.05)  # its prefill is a few microseconds, its decoding 0.4 s
            second = await generate(client, prompt, sampling_seed=1, max_new_tokens=1)
            assert not first.done()
            return [(await first)["meta_info"]["cached_tokens"], second["meta_info"]["cached_tokens"]]

    # SGLang checkpoints a prompt into the tree after its prefill (`checkpoint_kv_cache`).
    assert asyncio.run(scenario()) == [0, len(prompt) - 1]


def test_a_continued_completion_finds_its_whole_prefix_cached(prompt):
    async def scenario() -> tuple[dict, dict, dict]:
        async with served(*EXACT) as (_, client):
            cut = await generate(client, prompt, max_new_tokens=10)
            # First another prompt that goes on past the cut's ids: it finds all that was cached.
            longer = await generate(client, prompt + cut["output_ids"] + [5, 6, 7], max_new_tokens=1)
            more = await generate(client, prompt + cut["output_ids"], max_new_tokens=10)
            return cut, more, longer

    cut, more, longer = asyncio.run(scenario())
    assert cut["meta_info"]["finish_reason"] == {"type": "length", "length": 10}
    # Cached as it finished: the prompt and its output but the last id, whose KV was never computed.
    assert more["meta_info"]["prompt_tokens"] == len(prompt) + 10
    assert more["meta_info"]["cached_tokens"] == len(prompt) + 9
    assert longer["meta_info"]["cached_tokens"] == len(prompt) + 9


def test_without_a_prefix_cache_every_prompt_is_prefilled_whole(prompt):
    async def scenario() -> tuple[list[int], dict]:
        async with served(*EXACT, "--prefix-cache-tokens", "0") as (_, client):
            bodies = [await generate(client, prompt) for _ in range(2)]
            return [body["meta_info"]["cached_tokens"] for body in bodies], (await client.get("/sim/stats")).json()

    cached, stats = asyncio.run(scenario())
    assert cached == [0, 0]
    assert stats["prefill_tokens_computed"] == stats["prompt_tokens_total"] == 2 * len(prompt)
    assert stats["prefix_cache_tokens"] == 0


def test_stats_reset_zeroes_the_prompt_counters_but_keeps_the_cache(prompt):
    async def scenario() -> tuple[dict, dict]:
        async with served(*EXACT) as (_, client):
            await generate(client, prompt)
            reset = (await client.post("/sim/stats/reset")).json()
            await generate(client, prompt)
            return reset, (await client.get("/sim/stats")).json()

    reset, stats = asyncio.run(scenario())
    assert (reset["prompt_tokens_total"], reset["cached_tokens_total"], reset["prefill_tokens_computed"]) == (0, 0, 0)
    assert (stats["prompt_tokens_total"], stats["cached_tokens_total"]) == (len(prompt), len(prompt) - 1)
    assert stats["prefill_tokens_computed"] == 1


def test_chat_usage_reports_cached_tokens_with_enable_cache_report():
    async def usages(*flags: str) -> list[dict]:
        async with served(*EXACT, *flags) as (_, client):
            body = {"model": "m", "messages": MESSAGES}
            first = (await client.post("/v1/chat/completions", json=body)).json()
            stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
            events = (await client.post("/v1/chat/completions", json=stream)).text.split("\n\n")
            return [first["usage"], json.loads(events[-3].removeprefix("data: "))["usage"]]

    first, second = asyncio.run(usages("--enable-cache-report"))
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
    assert second["prompt_tokens_details"] == {"cached_tokens": second["prompt_tokens"] - 1}
    # Without the flag SGLang leaves prompt_tokens_details null (`UsageProcessor`).
    assert [usage["prompt_tokens_details"] for usage in asyncio.run(usages())] == [None, None]


def test_flush_cache_empties_the_cache_only_while_nothing_runs(prompt):
    slow = ("--page-size", "1", "--rate", "100", "--length-tokens", "30:30")

    async def scenario() -> list:
        async with served(*slow) as (server, client):
            await generate(client, prompt, max_new_tokens=1)
            running = asyncio.ensure_future(generate(client, prompt))
            while not server.capacity.running:
                await asyncio.sleep(0.005)
            busy = await client.post("/flush_cache")
            waited = await client.post("/flush_cache", params={"timeout": 5})  # until the request ends
            finished = await running
            after = await generate(client, prompt, max_new_tokens=1)
            return [busy.status_code, busy.text, waited.status_code, finished["meta_info"]["cached_tokens"],
                    after["meta_info"]["cached_tokens"]]

    busy_status, busy_text, waited_status, cached_while_busy, cached_after = asyncio.run(scenario())
    # sglang 0.5.23 `Scheduler.flush_cache` flushes only when fully idle; the endpoint answers 400.
    assert (busy_status, busy_text) == (400, "Flush cache failed.\n")
    assert waited_status == 200
    assert (cached_while_busy, cached_after) == (len(prompt) - 1, 0)


def test_two_requests_with_one_prompt_in_one_batch_both_miss_and_one_after_the_batch_hits(prompt):
    # A 1,000-token prompt keeps the prefill lane busy for 0.2 s while the two queue behind it.
    flags = ("--page-size", "1", "--prefill-rate", "5000", "--rate", "100000", "--length-tokens", "20:30",
             "--tick", "0.001")
    blocker = list(range(5000, 6000))

    async def scenario() -> tuple[list[int], dict]:
        async with served(*flags) as (server, client):
            first = asyncio.ensure_future(generate(client, blocker, max_new_tokens=1))
            while not server.capacity.stats().prefill_batches:
                await asyncio.sleep(0.005)
            together = await asyncio.gather(*(generate(client, prompt, sampling_seed=seed) for seed in (0, 1)))
            after = await generate(client, prompt, sampling_seed=2)
            await first
            cached = [body["meta_info"]["cached_tokens"] for body in [*together, after]]
            return cached, (await client.get("/sim/stats")).json()

    cached, stats = asyncio.run(scenario())
    # SGLang's FCFS batch matches each request before any of the batch is cached (checkpoint_kv_cache
    # runs after the batch): the two miss; the third, in a later batch, finds the prompt.
    assert cached == [0, 0, len(prompt) - 1]
    assert stats["prefill_batches"] == 3  # the blocker's, the two's, the third's
    assert stats["prefill_tokens_computed"] == len(blocker) + 2 * len(prompt) + 1
