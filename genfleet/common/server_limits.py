"""When the server, not genfleet, caps the batch: the server flag to change, named from its own load.

A fleet can offer a server all the work it likes and still run at half its speed when the server's
own settings hold the batch down. In the seeds that was the case: 1.5-2.2x came from server flags.
`status` (an alarm) and `doctor` read each host's load (`ServerLoad`, read by each server kind from
its own page: workers/servers/) and name the flag with the figure behind the advice:

- the running cap reached while requests wait and the KV cache is mostly free: SGLang's
  `--max-running-requests` (0.5.23: the scheduler's `max_running_requests`, `managers/scheduler.py`;
  `/v1/loads` reports it per rank, `managers/load_snapshot.py` `LoadSnapshot`), vLLM's
  `--max-num-seqs` (0.32 `config/scheduler.py` `max_num_seqs`; the scheduler admits no more once
  `num_running >= self.max_num_active_reqs`, which defaults to it, `v1/core/sched/scheduler.py`). vLLM's
  `/metrics` does not carry max_num_seqs (only the cache config's info gauge,
  `v1/metrics/loggers.py` `log_metrics_info`), so its cap is the running count's high mark held
  over several readings with requests waiting (workers/servers/vllm.py `LoadMeter`).
- the KV cache full with requests retracted (SGLang, `queues.retracted` in `/v1/loads`) or
  preempted (vLLM, `vllm:num_preemptions`): SGLang's `--mem-fraction-static` (the share of GPU
  memory for weights and the KV pool, `model_executor/pool_configurator.py`), vLLM's
  `--gpu-memory-utilization` (`config/cache.py`, default 0.92) or `--kv-cache-dtype fp8` (half the bytes per token).

A prefill-bound batch (SGLang `--chunked-prefill-size`, vLLM `--max-num-batched-tokens`) is not
judged: neither server's load page says how much of a step was prefill.
"""
from __future__ import annotations

from dataclasses import dataclass

from genfleet.common.fleet_stats import SGLANG, VLLM, ServerLoad

# The KV cache counts as "mostly free" below this share (the running cap, not memory, holds the
# batch), and as "full" from this one (a retraction then means memory is the limit).
KV_FREE_BELOW = 0.5
KV_FULL_FROM = 0.9

RUNNING_CAP_FLAG = {SGLANG: "--max-running-requests", VLLM: "--max-num-seqs"}
KV_FLAG = {SGLANG: "--mem-fraction-static", VLLM: "--gpu-memory-utilization (or --kv-cache-dtype fp8)"}
EVICTED = {SGLANG: "retracted", VLLM: "preempted"}


@dataclass(frozen=True)
class ServerLimit:
    flag: str  # the server's own flag to change
    figure: str  # what the load shows, in words and numbers
    advice: str  # what to do with the flag

    def line(self, url: str) -> str:
        return f"server-limited: {url}: {self.figure}: {self.advice} ({self.flag})"


def server_limit(load: ServerLoad) -> ServerLimit | None:
    """The server flag that holds this host's batch down, if its load shows one."""
    kind = load.server
    if kind not in RUNNING_CAP_FLAG:
        return None
    cap = load.max_running
    if cap and load.at_running_cap() and load.waiting > 0 and load.token_usage < KV_FREE_BELOW:
        flag = RUNNING_CAP_FLAG[kind]
        return ServerLimit(
            flag, f"{load.running} running, its cap ({flag} {cap}), with {load.waiting} waiting at "
                  f"{load.token_usage:.0%} KV use",
            f"restart the server with a higher {flag} (e.g. {2 * cap}): the KV cache has room")
    if load.retracted > 0 and load.token_usage >= KV_FULL_FROM:
        flag = KV_FLAG[kind]
        return ServerLimit(
            flag, f"KV cache {load.token_usage:.0%} full, {load.retracted} requests {EVICTED[kind]}",
            "give the KV cache more memory (evicted requests recompute their prompt; the server sheds them "
            "itself, and fewer in flight from the workers help only once they are fewer than its batch)")
    return None
