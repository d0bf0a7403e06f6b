"""`--loop-guard abort` against the real server: a plan that loops forever is stopped where the
guard finds its loop, written with `finish_reason: "loop"`, and the server stops generating it at
once; a plan that never repeats itself runs to max_new_tokens unflagged.

How the server lets go of a stream the worker cut (SGLang 0.5.23): closing the connection is
enough on its own. `TokenizerManager.generate_request` wraps the stream in `except BaseException`
and calls `_release_req_states_on_failure`, which sends the scheduler an abort for every dispatched
request (`managers/tokenizer_manager.py`): Starlette cancels the stream's generator as soon as
the client leaves. (The 2 s `create_abort_task` of `entrypoints/http_server.py` is only a
fallback.) The worker's `POST /abort_request` comes after the close and finds the request already
aborted (`abort_request` returns early on `state.abort_sent`); it is what frees a slot behind a
router that keeps its own connection to the server, so it is checked here on its own, on a stream
the client still holds open.

What the server generated is read from its radix cache: an aborted request's KV is cached like a
finished one's, so a later prompt that follows the same plan further finds the prompt and every
token the aborted request decoded but its last cached (`meta_info.cached_tokens`).
"""
from __future__ import annotations

import json

import httpx
from helpers.data import write_jsonl
from helpers.waits import wait_until
from plan import Turn, split_context
from tier import Expectations, enqueue, start_pools

from genfleet.workers.generation.loop_guard import DEFAULT, LoopDetector
from genfleet.workers.servers.sglang import new_rid

MAX_NEW_TOKENS = 10240  # the short partition's default: what each loop would cost unguarded
# Three loops: periods of 3, 5 and 1 words after the content's first 6 words.
LOOPS = ("[plan loop=3]", "[plan loop=5 think=20]", "[plan loop=1 think=5]")
LAG = 256  # tokens the server may run ahead of the worker's cut (a few, measured): 2.5% of max_new_tokens
# Ids a chunk may carry past the checkpoint that found the loop: 8 a chunk, or several intervals in one
# when the worker reads behind the server (0.5.23 `tokenizer_manager.py::_stream_one_response` drains
# every pending output at once: the last of them for a cumulative stream, coalesced for deltas).
CHUNK_SLACK = 64


def loop_start(expect: Expectations, record: dict) -> tuple[int, int]:
    """Where the plan's repeating unit first starts in the output ids, and its length in tokens."""
    prompt = expect.prompt_ids(record)
    start = split_context(prompt, expect.vocab)
    turn = Turn(expect.vocab, prompt[:start])
    generated = prompt[start:]  # the template's own `<think>`
    head = turn.head_for(generated)
    assert head is not None
    at, unit = turn.loop_unit()
    return len(head) - len(generated) + at, len(unit)


def server_decoded(server, prompt_ids: list[int], plan_ids: list[int]) -> int:
    """How many tokens the server generated for `prompt_ids` before it stopped: asked for the plan
    further than it went, the radix cache holds the prompt and every decoded token but the last
    (whose KV was never computed), and `cached_tokens` counts them."""
    body = {"input_ids": prompt_ids + plan_ids, "sampling_params": {"max_new_tokens": 1}}
    answer = httpx.post(f"{server.url}/generate", json=body, timeout=60).raise_for_status().json()
    return answer["meta_info"]["cached_tokens"] - len(prompt_ids) + 1


def test_a_looping_plan_is_stopped_at_its_loop_and_the_server_stops_generating_it_at_once(
        cumulative, real_fleet, model, plan_vocab, tmp_path):
    real_fleet.configure(stream_interval=8)
    data = write_jsonl(tmp_path / "l.jsonl", [{"prompt": f"loop {i} {d}"} for i, d in enumerate(LOOPS)])
    # What the server decoded is read from its radix cache: nothing of an earlier run may be in it.
    cumulative.flush_cache()
    worker = real_fleet.start_worker("short", cumulative.url, concurrency=4, wait=False)
    enqueue(real_fleet, model, "loops", f"l={data}", extra=("--keep-token-ids", "--loop-guard", "abort"))
    progress = real_fleet.wait_finished("loops", timeout=120)
    # The last record was written right after its stream was cut: the server is idle already (it
    # would otherwise decode on toward 10,240 tokens, seconds more).
    wait_until(lambda: cumulative.load()["num_running_reqs"] == 0, 1.0, 0.05,
               lambda: f"the server still runs the cut requests: {cumulative.load()}")
    totals = progress.totals()
    assert (totals.done, totals.failed, totals.looped) == (len(LOOPS), 0, len(LOOPS))

    expect = Expectations(model, plan_vocab)
    records = real_fleet.records("loops")
    assert len(records) == len(LOOPS)
    for record in records:
        ids = record["output_ids"]
        loop = record["loop"]
        assert record["finish_reason"] == "loop"
        assert set(loop) == {"period", "repeats", "start", "at_token"}
        plan = expect.output_ids(record, len(ids) + 4 * DEFAULT.max_period)
        assert ids == plan[:len(ids)], record["id"]  # the plan's, up to the cut
        starts, unit = loop_start(expect, record)
        # The unit's length, or a divisor of it (a unit of one repeated word), from where it first
        # starts (or earlier, where the words before it happen to repeat it too).
        assert unit % loop["period"] == 0 and loop["start"] <= starts, (record["id"], loop, starts, unit)
        # Found at a checkpoint, within the guard's bound of the loop's start.
        assert loop["at_token"] % DEFAULT.check_every == 0
        assert loop["at_token"] - loop["start"] >= DEFAULT.span(loop["period"])
        assert loop["at_token"] <= starts + DEFAULT.latest(loop["period"])
        assert loop["repeats"] == (loop["at_token"] - loop["start"]) // loop["period"]
        # Cut at the chunk that reached the checkpoint: what the record holds, and what it cost.
        assert loop["at_token"] <= len(ids) < loop["at_token"] + CHUNK_SLACK
        assert record["usage"]["completion_tokens"] == len(ids)
        decoded = server_decoded(cumulative, expect.prompt_ids(record), plan)
        assert len(ids) <= decoded <= len(ids) + LAG, (record["id"], decoded)
    assert "/abort_request" not in worker.tail(400)  # every abort answered 200 (a warning otherwise)


def test_a_plan_that_never_repeats_itself_runs_to_max_new_tokens_unflagged(
        cumulative, real_fleet, model, plan_vocab, tmp_path):
    cap = 4 * DEFAULT.latest(64)  # four times as far as the guard needs to find a loop of period <= 64
    real_fleet.configure(stream_interval=8)
    data = write_jsonl(tmp_path / "f.jsonl", [{"prompt": "endless [plan forever think=10]"}])
    real_fleet.start_worker("short", cumulative.url, wait=False)
    enqueue(real_fleet, model, "endless", f"f={data}",
            extra=("--keep-token-ids", "--loop-guard", "abort", "--max-new-tokens-short", str(cap)))
    progress = real_fleet.wait_finished("endless", timeout=120)
    assert (progress.totals().done, progress.totals().looped) == (1, 0)

    expect = Expectations(model, plan_vocab)
    [record] = real_fleet.records("endless")
    assert record["finish_reason"] == "length" and "loop" not in record
    assert record["output_ids"] == expect.output_ids(record, cap)
    assert (record["reasoning"], record["content"]) == expect.split(record, cap)


def test_a_loop_across_a_continuation_cut_is_found_where_it_would_be_without_the_cut(
        incremental, real_fleet, model, plan_vocab, tmp_path):
    """The guard of the continuation starts with the ids of the part before the cut (a cut before
    the loop could be found), so the loop is found at the same token, and never continued. On the
    delta-streaming server (the loop test above reads the cumulative one)."""
    server = incremental
    first_cap = 200  # well inside the periodic run: no loop is found by then (it needs 512 tokens)
    real_fleet.configure(stream_interval=8, reasoning_parser="deepseek-r1")
    data = write_jsonl(tmp_path / "c.jsonl", [{"prompt": f"crossing {i} {d}"} for i, d in enumerate(LOOPS[:2])])
    start_pools(real_fleet, server.url, "short", "long")
    enqueue(real_fleet, model, "crossing", f"c={data}",
            extra=("--keep-token-ids", "--loop-guard", "abort", "--on-truncated", "continue",
                   "--max-new-tokens-short", str(first_cap), "--max-new-tokens-long", str(MAX_NEW_TOKENS),
                   "--max-new-tokens-total", str(MAX_NEW_TOKENS)))
    progress = real_fleet.wait_finished("crossing", timeout=120)
    assert (progress.totals().done, progress.totals().looped, progress.totals().continued) == (2, 2, 2)

    expect = Expectations(model, plan_vocab)
    for record in real_fleet.records("crossing"):
        ids = record["output_ids"]
        plan = expect.output_ids(record, len(ids) + 4 * DEFAULT.max_period)
        assert ids == plan[:len(ids)]
        assert record["finish_reason"] == "loop" and record["continued"] == 1
        assert record["loop"] == uncut_loop(plan), record["id"]
        assert first_cap < record["loop"]["at_token"] <= len(ids) < record["loop"]["at_token"] + CHUNK_SLACK


def uncut_loop(plan: list[int]) -> dict[str, int]:
    """The loop the guard finds in the plan streamed whole, 8 tokens a chunk."""
    detector = LoopDetector(DEFAULT)
    for at in range(0, len(plan), 8):
        if (found := detector.extend(plan[at:at + 8])) is not None:
            return found.to_dict()
    raise AssertionError("the plan has no loop the guard can find")


def test_genfleets_abort_request_alone_stops_a_stream_the_client_still_holds_open(
        cumulative, sglang_server, model, plan_vocab):
    """The worker's abort call on its own (`SglangServer.abort`), with nothing disconnected:
    the real server ends the stream with `finish_reason` abort, far short of max_new_tokens."""
    expect = Expectations(model, plan_vocab)
    asked = {"messages": [{"role": "user", "content": "held open [plan forever]"}]}
    rid = new_rid()
    body = {"rid": rid, "input_ids": expect.prompt_ids(asked), "stream": True,
            "sampling_params": {"max_new_tokens": MAX_NEW_TOKENS, "stream_interval": 8}}
    aborted_at = None
    last: dict = {}
    with httpx.stream("POST", f"{cumulative.url}/generate", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                last = json.loads(line.removeprefix("data: "))
                if aborted_at is None and last["meta_info"]["completion_tokens"] >= 200:
                    aborted_at = last["meta_info"]["completion_tokens"]
                    sglang_server.abort(cumulative.url, rid)
    meta = last["meta_info"]
    assert aborted_at is not None and meta["finish_reason"]["type"] == "abort", meta["finish_reason"]
    assert aborted_at <= meta["completion_tokens"] <= aborted_at + LAG
    ids = last["output_ids"]  # cumulative: every id so far
    assert len(ids) == meta["completion_tokens"] and ids == expect.output_ids(asked, len(ids))


def test_a_stream_the_client_closes_is_aborted_by_the_server_at_once_not_after_two_seconds(
        cumulative, model, plan_vocab):
    """What makes the worker's close enough on its own with 0.5.23 (the module's docstring), and
    where genfleet's simulator differs: `sim/engine.py` lets a closed stream decode on for the 2 s
    of `create_abort_task` by default."""
    expect = Expectations(model, plan_vocab)
    asked = {"messages": [{"role": "user", "content": "closed [plan forever]"}]}
    cumulative.flush_cache()
    body = {"rid": new_rid(), "input_ids": expect.prompt_ids(asked), "stream": True,
            "sampling_params": {"max_new_tokens": MAX_NEW_TOKENS, "stream_interval": 8}}
    with httpx.stream("POST", f"{cumulative.url}/generate", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: {") and json.loads(line.removeprefix("data: "))["meta_info"][
                    "completion_tokens"] >= 200:
                break  # leaving the block closes the connection; no /abort_request
    wait_until(lambda: cumulative.load()["num_running_reqs"] == 0, 1.0, 0.05,
               lambda: f"the closed stream still runs: {cumulative.load()}")
    decoded = server_decoded(cumulative, expect.prompt_ids(asked), expect.output_ids(asked, 200 + 4 * LAG))
    assert 200 <= decoded <= 200 + LAG, decoded
