"""When the server's own flags hold the batch down, `status` and `doctor` name the flag
(common/server_limits.py): from SGLang's `/v1/loads` (its `max_running_requests`) and from vLLM's
`/metrics` (its running count's high mark held while requests wait: servers/vllm.py `LoadMeter`)."""
from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from genfleet.common.fleet_stats import SGLANG, VLLM, ServerLoad
from genfleet.common.server_limits import server_limit
from genfleet.workers.servers.sglang_info import load_from_loads
from genfleet.workers.servers.vllm import CAP_READINGS, LoadMeter, MetricsPage


def sglang_loads(running: int, waiting: int, usage: float, cap: int, retracted: int = 0) -> dict:
    """One rank of SGLang 0.5.23's `/v1/loads` (`managers/load_snapshot.py` `LoadSnapshot.to_dict`)."""
    return {"loads": [{"dp_rank": 0, "num_running_reqs": running, "num_waiting_reqs": waiting,
                       "token_usage": usage, "max_total_num_tokens": 400_000, "max_running_requests": cap,
                       "gen_throughput": 900.0, "queues": {"retracted": retracted}}]}


def test_sglang_at_its_running_cap_with_requests_waiting_and_kv_free_names_max_running_requests():
    load = load_from_loads(sglang_loads(running=48, waiting=30, usage=0.21, cap=48))
    assert (load.max_running, load.server) == (48, SGLANG)
    limit = server_limit(load)
    assert limit is not None and limit.flag == "--max-running-requests"
    assert "48 running" in limit.figure and "30 waiting" in limit.figure and "21% KV" in limit.figure
    assert not load.admission_bound()  # the cap holds them, not the KV reservation


def test_below_the_cap_or_with_nothing_waiting_or_kv_full_no_running_cap_is_named():
    assert server_limit(load_from_loads(sglang_loads(30, 30, 0.21, 48))) is None
    assert server_limit(load_from_loads(sglang_loads(48, 0, 0.21, 48))) is None
    assert server_limit(load_from_loads(sglang_loads(48, 30, 0.7, 48))) is None


def test_a_full_kv_cache_that_retracts_names_the_memory_flag_of_each_server():
    sglang = server_limit(load_from_loads(sglang_loads(20, 9, 0.97, 256, retracted=4)))
    assert sglang is not None and sglang.flag == "--mem-fraction-static" and "4 requests retracted" in sglang.figure
    vllm = server_limit(ServerLoad(running=20, waiting=9, token_usage=0.95, retracted=3, gen_throughput=0.0,
                                   server=VLLM))
    assert vllm is not None and vllm.flag.startswith("--gpu-memory-utilization") and "preempted" in vllm.figure


def page(running: int, waiting: int, usage: float = 0.1) -> MetricsPage:
    return MetricsPage(running=running, waiting=waiting, kv_usage=usage, preemptions=0.0, generated_tokens=0.0)


def test_vllm_running_held_with_requests_waiting_is_its_max_num_seqs():
    meter = LoadMeter()
    loads = [meter.load("u", page(8, 40), now=float(n)) for n in range(CAP_READINGS)]
    assert [load.max_running for load in loads] == [None] * (CAP_READINGS - 1) + [8]
    limit = server_limit(loads[-1])
    assert limit is not None and limit.flag == "--max-num-seqs" and "8 running" in limit.figure


def test_a_draining_vllm_batch_is_not_a_cap():
    # A count falling within the slack while requests wait never reads its high mark again.
    meter = LoadMeter()
    assert [meter.load("u", page(running, 9), now=float(n)).max_running for n, running in
            enumerate([40, 39, 38, 37, 36])] == [None] * 5


def test_sglangs_reported_cap_is_judged_exactly_and_an_idle_server_is_at_no_cap():
    below = ServerLoad(running=7, waiting=40, token_usage=0.1, retracted=0, gen_throughput=1.0, max_running=8,
                       server=SGLANG)
    assert not below.at_running_cap() and server_limit(below) is None and below.admission_bound()
    assert replace(below, running=8).at_running_cap()
    assert replace(below, server=VLLM).at_running_cap()  # vLLM's inferred cap: within its slack
    idle = ServerLoad(running=0, waiting=3, token_usage=0.0, retracted=0, gen_throughput=0.0, max_running=1,
                      server=VLLM)
    assert not idle.at_running_cap()


def test_vllm_cap_is_named_though_a_page_between_two_steps_reads_one_below_it():
    # vLLM counts a step's finished requests out before the next step admits their replacements: at
    # --max-num-seqs 8 with short replies its pages read 8, 7, 8, 7 (bench section 14, no alarm).
    meter = LoadMeter()
    loads = [meter.load("u", page(running, 40), now=float(n)) for n, running in enumerate([8, 7, 8, 7, 7])]
    assert [load.max_running for load in loads] == [None, None, 8, 8, 8]
    limit = server_limit(loads[-1])
    assert limit is not None and "(--max-num-seqs 8)" in limit.figure and "7 running" in limit.figure


# Counts near one another (a cap with its dips), and anywhere (a server below its cap).
RUNNING_COUNTS = st.one_of(st.integers(6, 9), st.integers(18, 24), st.integers(1, 40))


@given(st.lists(st.tuples(RUNNING_COUNTS, st.integers(0, 3), st.sampled_from([0.1, 0.9])), max_size=40))
def test_vllm_cap_is_inferred_only_after_a_high_mark_held_that_many_pages_with_requests_waiting(pages):
    meter = LoadMeter()
    for index, (running, waiting, usage) in enumerate(pages):
        load = meter.load("u", page(running, waiting, usage), now=float(index))
        # The pages in a row before this one with requests waiting at a free cache, this one included.
        run: list[int] = []
        for earlier, waited, used in reversed(pages[:index + 1]):
            if not (waited and used < 0.5):
                break
            run.insert(0, earlier)
        # The last stretch of that run whose pages all stay within the slack of its first page, and
        # never above it: a higher page starts a new high mark, a lower one past the slack too.
        # It counts only once the mark itself was read twice in that stretch.
        mark, stretch = None, []
        for earlier in run:
            if mark is None or earlier > mark or earlier < mark - max(1, mark // 8):
                mark, stretch = earlier, []
            stretch.append(earlier)
        held = len(stretch) if stretch.count(mark) >= 2 else 0
        assert load.max_running == (mark if held >= CAP_READINGS else None), (pages[:index + 1], load)
        if load.max_running is not None:
            assert load.running <= load.max_running
