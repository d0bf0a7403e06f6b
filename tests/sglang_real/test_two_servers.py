"""One worker over two real SGLang servers: the samples of long prompts routed by prefix affinity find
more of the real radix cache (`meta_info.cached_tokens`) than least-busy routing does, over two hosts
of different stream modes; and a server SIGKILLed mid-run leaves every prompt done, once, on the other."""
from __future__ import annotations

import random
import time
from collections import Counter

import pytest
from helpers.data import read_jsonl, write_jsonl
from helpers.waits import wait_until
from plan import ASCII_WORDS
from server import RealServer
from tier import Expectations, enqueue, write_plan_prompts

from genfleet.common.run_state import RunState

MAX_NEW_TOKENS = 10240  # the short partition's default (the long one's is higher): every plan here stops first
SAMPLES = 4
# An odd count: least-busy routing alternating strictly between two hosts would otherwise send every
# sample of a prompt to one host by accident.
PROMPTS = 21
DOCUMENT_WORDS = 500  # ~850 tokens of each prompt that only its own samples share
KILL_PROMPTS = 48  # two hosts x 6 slots, four waves: the victim finishes some before it dies
HEAD_TOKENS = 16  # what a sample cold on its host may still find cached: the prompts' shared head


def write_document_prompts(path, count: int, directive: str):
    """Prompts `document <i>: <~500 words of its own> <directive>`: a long prefix per prompt."""
    rows = []
    for i in range(count):
        words = random.Random(i).choices(ASCII_WORDS, k=DOCUMENT_WORDS)
        rows.append({"prompt": f"document {i}: {' '.join(words)} {directive}"})
    return write_jsonl(path, rows)


def run_samples(fleet, model, servers, data, run: str, pool: str) -> list[dict]:
    for server in servers:
        server.flush_cache()  # neither run inherits the other's cache
    enqueue(fleet, model, run, f"docs={data}:{pool}", extra=("--keep-token-ids", "--samples", str(SAMPLES),
                                                              "--temperature", "0.6"))
    progress = fleet.wait_finished(run, timeout=180)
    assert progress.totals().done == PROMPTS * SAMPLES and progress.totals().failed == 0
    return fleet.records(run)


def test_affinity_routing_finds_more_of_the_real_radix_cache_than_least_busy_over_mixed_hosts(
        cumulative, incremental, real_fleet, model, plan_vocab, tmp_path):
    # The session's two servers differ in stream mode (genfleet reads each one's from /server_info)
    # and in --reasoning-parser, which only SGLang's chat API applies: over /generate the worker
    # splits the ids itself, with its own parser.
    real_fleet.configure(reasoning_parser="kimi_k2", stream_interval=8)
    data = write_document_prompts(tmp_path / "docs.jsonl", PROMPTS, "[plan len=8 think=6]")
    servers = (cumulative, incremental)
    # One worker per routing, each on its own queue, started together (each takes seconds).
    pools = {"affinity": "short", "least-busy": "long"}
    workers = []
    for routing, pool in pools.items():
        real_fleet.configure(routing=routing)
        workers.append(real_fleet.start_worker(pool, cumulative.url, incremental.url, concurrency=8, wait=False))
    for worker in workers:
        worker.wait_ready()
    runs = {routing: run_samples(real_fleet, model, servers, data, routing, pool) for routing, pool in pools.items()}

    expect = Expectations(model, plan_vocab)
    cached, cold = {}, {}
    for routing, records in runs.items():
        assert len(records) == PROMPTS * SAMPLES
        assert {record["upstream"] for record in records} == {cumulative.url, incremental.url}
        cold_on = Counter()
        for record in records:
            ids = expect.output_ids(record, MAX_NEW_TOKENS)
            assert record["output_ids"] == ids, record["id"]
            assert (record["reasoning"], record["content"]) == expect.split(record, MAX_NEW_TOKENS), record["id"]
            usage = record["usage"]
            # The radix cache (page size 1) gives a sample whose prompt its host computed before the
            # whole prompt but its last token, always prefilled for its logits (0.5.23
            # `managers/schedule_batch.py` `_compute_max_prefix_len`); the first there finds at most
            # the template's head that every prompt shares ("<|im_user|>user<|im_middle|>document ").
            warm = usage["cached_tokens"] == usage["prompt_tokens"] - 1
            assert warm or usage["cached_tokens"] < HEAD_TOKENS, (routing, record["id"], usage)
            if not warm:
                cold_on[(record["id"].split("#")[0], record["upstream"])] += 1
        placed = {(record["id"].split("#")[0], record["upstream"]) for record in records}
        # Flushed before each run: every host a prompt went to computed it once (or more, when two
        # of its samples shared a prefill batch: only the cache-aware policies match within a batch,
        # 0.5.23 `managers/schedule_policy.py` `_compute_prefix_matches`, and the default is fcfs).
        assert set(cold_on) == placed, (routing, placed - set(cold_on))
        cached[routing] = sum(record["usage"]["cached_tokens"] for record in records)
        cold[routing] = sum(cold_on.values())
    print(f"cached tokens over {PROMPTS} prompts x {SAMPLES} samples: {cached}; cold prefills: {cold}")
    assert cold["affinity"] < cold["least-busy"]
    assert cached["affinity"] > 1.15 * cached["least-busy"]


# Retries at once and a dead host found within a second; its breaker stays open for the run.
QUICK = dict(retry_backoff_s=0.1, retry_backoff_max_s=0.5, health_interval_s=1, breaker_open_s=600)
LONG_PLAN = "[plan len=400 think=20]"


@pytest.mark.kills_a_server
@pytest.mark.timeout(600)  # its two servers' startup (30-45 s alone, minutes on a busy machine) on top
def test_a_server_sigkilled_mid_run_leaves_every_prompt_done_once_on_the_other(
        venv, model, plan_vocab, real_fleet, tmp_path):
    victim, survivor = (RealServer(venv, model, "--reasoning-parser", "kimi_k2", name=name)
                        for name in ("victim", "survivor"))
    try:
        for server in (victim, survivor):
            server.spawn()
        for server in (victim, survivor):
            server.wait_healthy()
        real_fleet.configure(reasoning_parser="kimi_k2", **QUICK)
        data = write_plan_prompts(tmp_path / "k.jsonl", KILL_PROMPTS, (LONG_PLAN,), stem="long question")
        real_fleet.start_worker("short", victim.url, survivor.url, concurrency=12)
        enqueue(real_fleet, model, "kill", f"k={data}", extra=("--keep-token-ids",))

        def mid_flight() -> int:  # the victim's first records on disk, and others still streaming there
            on_victim = sum(record["upstream"] == victim.url for record in real_fleet.records("kill"))
            return on_victim and victim.load()["num_running_reqs"]

        started = time.time()
        running = wait_until(mid_flight, 120, 0.1, "the victim never had records on disk and requests running")
        victim.kill()
        killed_at = time.time()
        progress = real_fleet.wait_finished("kill", timeout=180)
        finished = time.time()
    finally:
        victim.kill()
        survivor.stop()

    ids = {f"k/{i}" for i in range(KILL_PROMPTS)}
    records = real_fleet.records("kill")
    assert progress.totals().done == KILL_PROMPTS and progress.totals().failed == 0
    assert RunState(real_fleet.redis, "kill").dead_letters() == {}
    assert sorted(record["id"] for record in records) == sorted(ids), "a prompt missing, or written twice"
    expect = Expectations(model, plan_vocab)
    for record in records:
        assert record["output_ids"] == expect.output_ids(record, MAX_NEW_TOKENS), record["id"]
        assert record["finish_reason"] == "stop"
        ended = record["timing"]["started_at"] + record["timing"]["duration_s"]
        # The victim's records all ended before it died; everything after is the survivor's.
        if record["upstream"] == victim.url:
            assert ended < killed_at + 1, record["id"]
        else:
            assert record["upstream"] == survivor.url
    retried = [record for record in records if record["attempts"] > 1]
    assert retried, "no prompt was streaming on the victim when it died"
    assert all(record["upstream"] == survivor.url for record in retried)

    out = tmp_path / "export"
    real_fleet.genfleet("export", "--run", "kill", "--from", str(real_fleet.output_dir), "--out", str(out),
                        "--format", "openai", "--redis-url", real_fleet.redis_url)
    exported = [row["id"] for row in read_jsonl(out / "all.jsonl")]
    assert sorted(exported) == sorted(ids), "an id exported twice, or one missing"
    print(f"killed {killed_at - started:.1f} s into the run with {running} running there; "
          f"{len(retried)} prompts retried on the survivor; {sum(r['upstream'] == victim.url for r in records)} "
          f"of {KILL_PROMPTS} done on the victim before; finished {finished - killed_at:.1f} s after")
