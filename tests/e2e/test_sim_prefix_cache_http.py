"""The simulator's prefix cache over real HTTP: a repeated prompt reports its cached tokens, is not
prefilled again (its first token comes sooner, its prefill batch is shorter) and the stats count
one prefill; /flush_cache empties the cache."""
from __future__ import annotations

import json
import time

import httpx
import pytest
from helpers.sim_http import FAST
from helpers.sim_process import SimProcess

PREFILL_RATE = 500  # prompt tokens/s: a 400-token prompt takes 0.8 s
PROMPT = list(range(1000, 1400))
PAGE = 16  # the default --page-size


@pytest.fixture(scope="module")
def cached_sim():
    with SimProcess(*FAST, "--prefill-rate", str(PREFILL_RATE)) as process:
        yield process


def first_token_and_last_chunk(sim: SimProcess, ids: list[int]) -> tuple[float, dict]:
    """Seconds until the stream's first chunk, and its last chunk."""
    started, first, last = time.monotonic(), None, None
    with httpx.stream("POST", f"{sim.url}/generate", json={"input_ids": ids, "stream": True}, timeout=30) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                first = first if first is not None else time.monotonic() - started
                last = json.loads(line.removeprefix("data: "))
    assert first is not None and last is not None
    return first, last


def test_a_repeated_prompt_is_served_from_the_cache_and_prefilled_once(cached_sim):
    cached_sim.reset_stats()
    cold_s, cold = first_token_and_last_chunk(cached_sim, PROMPT)
    warm_s, warm = first_token_and_last_chunk(cached_sim, PROMPT)

    # At most len - 1 tokens are reused (SGLang prefills the last for its logits), in whole pages.
    cached = (len(PROMPT) - 1) // PAGE * PAGE
    assert (cold["meta_info"]["cached_tokens"], warm["meta_info"]["cached_tokens"]) == (0, cached)
    assert warm["meta_info"]["cached_tokens_details"] == {"device": cached, "host": 0}
    assert warm["output_ids"] == cold["output_ids"]
    assert cold_s >= len(PROMPT) / PREFILL_RATE - 0.05
    assert warm_s < cold_s / 2  # 16 tokens to prefill (0.03 s) against 400 (0.8 s)
    stats = cached_sim.stats()
    assert (stats["prompt_tokens_total"], stats["cached_tokens_total"]) == (2 * len(PROMPT), cached)
    assert stats["prefill_tokens_computed"] == len(PROMPT) + (len(PROMPT) - cached)
    # Two prefill batches, one each, which held the server's GPU for their uncached tokens.
    assert stats["prefill_batches"] == 2
    assert stats["prefill_busy_s"] == pytest.approx(stats["prefill_tokens_computed"] / PREFILL_RATE)
    print(f"first token: {cold_s:.3f} s cold, {warm_s:.3f} s with {cached} of {len(PROMPT)} tokens cached")


def test_flush_cache_empties_the_prefix_cache(cached_sim):
    first_token_and_last_chunk(cached_sim, PROMPT)
    assert cached_sim.stats()["prefix_cache_tokens"] > 0
    response = httpx.post(f"{cached_sim.url}/flush_cache", timeout=5)
    assert response.status_code == 200 and response.text.startswith("Cache flushed.")
    assert cached_sim.stats()["prefix_cache_tokens"] == 0
    cold_s, cold = first_token_and_last_chunk(cached_sim, PROMPT)
    assert cold["meta_info"]["cached_tokens"] == 0 and cold_s >= len(PROMPT) / PREFILL_RATE - 0.05
