"""Why a `make bench` figure missed its target and what would fix it: one note per target, written
into the report only when the target is missed. The profiling figures quoted are those measured
when the bench was written."""
from __future__ import annotations

import os
from dataclasses import dataclass
from statistics import median

from bench.throughput import SLOTS, Comparison
from genfleet.common.settings import Settings


@dataclass(frozen=True)
class ThroughputMedians:
    """Medians over the throughput runs, quoted by the figures' details and the notes."""

    genfleet_tok_s: float
    baseline_tok_s: float
    genfleet_occupancies: list[float]  # one per run: a figure of its own
    baseline_occupancy: float
    genfleet_cpu_us_per_token: float
    baseline_cpu_us_per_token: float
    genfleet_task_cpu_ms: float
    tokens_per_prompt: float
    completions_per_s: float
    peak_running: int  # the lowest of the runs' peaks
    knee: float

    @classmethod
    def of(cls, runs: list[Comparison]) -> ThroughputMedians:
        return cls(
            genfleet_tok_s=median([c.genfleet.tokens_per_s for c in runs]),
            baseline_tok_s=median([c.baseline.tokens_per_s for c in runs]),
            genfleet_occupancies=[c.genfleet.occupancy or 0.0 for c in runs],
            baseline_occupancy=median([c.baseline.occupancy or 0.0 for c in runs]),
            genfleet_cpu_us_per_token=median([c.genfleet.cpu_us_per_token for c in runs]),
            baseline_cpu_us_per_token=median([c.baseline.cpu_us_per_token for c in runs]),
            genfleet_task_cpu_ms=median([1e3 * c.genfleet.client_cpu_s / c.genfleet.prompts for c in runs]),
            tokens_per_prompt=median([c.genfleet.completion_tokens / c.genfleet.prompts for c in runs]),
            # 0 when no run had a steady state (a quick run can end before its window opens).
            completions_per_s=median([c.genfleet.window.requests / c.genfleet.window.seconds for c in runs
                                      if c.genfleet.window] or [0.0]),
            peak_running=min(c.genfleet.sim_peak_running for c in runs),
            knee=runs[0].profile.knee,
        )

    @property
    def genfleet_occupancy(self) -> float:
        return median(self.genfleet_occupancies)


def _served_share(occupancy: float, knee: float) -> float:
    """Server tokens/s at this occupancy, relative to a full server: running × rate / (1 + running / knee)."""
    running = occupancy * SLOTS
    return (running / (1 + running / knee)) / (SLOTS / (1 + SLOTS / knee))


# The share of bench/affinity.py's prompt tokens a perfect prefix cache could serve: the 4 samples of
# a ~1,500-token prompt share it (3 of 4 cached), a conversation's turn 2 and 3 extend the previous
# turn's prompt and reply: ~1.90M of 2.56M tokens.
CACHEABLE_SHARE = 0.72


def throughput_note(m: ThroughputMedians) -> str:
    knee, b_occ, g_occ = m.knee, m.baseline_occupancy, m.genfleet_occupancy
    # The occupancy at which a full server would be 1.3x the baseline's: solve served(x) = 1 / 1.3.
    needed = 1 / (1.3 * (1 + SLOTS / knee) - SLOTS / knee)
    return (
        f"The baseline reached {m.baseline_tok_s:,.0f} tok/s against genfleet's {m.genfleet_tok_s:,.0f}, holding "
        f"the server {b_occ:.0%} busy against genfleet's {g_occ:.1%}. In the capacity model a server running "
        f"fewer requests decodes each one faster (`rate / (1 + running / {knee:g})`), so {b_occ:.0%} "
        f"occupancy still yields {_served_share(b_occ, knee):.0%} of a full server's tokens/s: even a genfleet "
        f"at 100% could be at most {1 / _served_share(b_occ, knee):.2f}× the baseline here. For 1.3× the "
        f"baseline must hold the server below {needed:.0%} busy, which happens only when its one process cannot "
        f"parse SGLang's cumulative interval-1 stream as fast as the server produces it; that cost grows with "
        f"the square of the completion length, and this profile's completions are short "
        f"(~{m.tokens_per_prompt:,.0f} tokens) so that 2,000 of them fit in under a minute. genfleet is not "
        f"the limit (it holds the server at {g_occ:.1%}). What would change the figure: state the "
        f"target for a workload (completion length and tok/s per host) or bench longer completions "
        f"(reasoning outputs of thousands of tokens), at several minutes per run."
    )


def occupancy_note(m: ThroughputMedians) -> str:
    idle = 1 - m.genfleet_occupancy
    gap_ms = 1e3 * idle * SLOTS / m.completions_per_s if m.completions_per_s else float("nan")
    return (
        f"Each Celery task thread is also a stream slot (concurrency 150 = per-host cap 150), so after a "
        f"stream ends its slot stays empty while the thread group-commits the record (fsync every "
        f"{1e3 * Settings().commit_interval_s:.0f} ms), updates the run state in Redis, acks, "
        f"and Celery fetches the next message: "
        f"about {gap_ms:.0f} ms per prompt at {m.completions_per_s:.0f} completions/s, "
        f"{idle:.1%} of the slots. Fix (`workers/runtime.py`, `workers/command.py`): run more task "
        f"threads than streams, e.g. concurrency 150 × hosts + 16, and keep the per-host cap at 150 "
        f"(today `_per_upstream_cap` derives it from the concurrency); the spare threads wait in "
        f"`UpstreamPool.lease()` and start the next stream the moment one ends. Trials with 16 spare "
        f"threads (cap patched to 150, nothing else changed) measured 99.6% and 99.8% against 97.4% "
        f"and 97.8% without, in the same conditions on this machine, when the bench was written."
    )


def cpu_note(m: ThroughputMedians) -> str:
    return (
        f"The worker spends about {m.genfleet_task_cpu_ms:.1f} ms of CPU per prompt "
        f"({m.genfleet_cpu_us_per_token:.1f} µs per token at ~{m.tokens_per_prompt:,.0f} tokens per completion), "
        f"the baseline {m.baseline_cpu_us_per_token:.1f} µs per token: the worker's cost is mostly per task, "
        f"the baseline's per token. Measured per phase with thread CPU clocks (`time.thread_time` around "
        f"each step of the task, 1,000 prompts, 2026-12-01, before the streams moved to `http.client`): the "
        f"stream ~3.2 ms a task, Celery's event loop (fetch, ack, events) ~1.5-2 ms, the done mark ~0.3 ms, "
        f"routing ~0.3 ms, the record and its write ~0.2 ms. The streams over `http.client` "
        f"(`workers/servers/transport.py`) took ~1.2 ms a task off. What is left to take: fewer chunks per "
        f"token (a `stream_interval` of 64), or streams off OS threads (one event loop reading all 150 "
        f"sockets: a different worker); the ratio also falls with longer completions, which spread the "
        f"per-task cost over more tokens."
    )


def rss_note() -> str:
    return ("The worker's resident set grew past the target: look at the records and stream buffers held "
            "per in-flight task, and at the shard writer's buffers.")


def onebox_note() -> str:
    return ("`genfleet run` pays a fixed ~2 s the script does not: its own start (its imports, then a "
            "redis-server) before any worker starts, the short worker's start (Celery, kombu, the tokenizer: "
            "about 1.5 s of a core here) before its first request, and a graceful stop of the pool and Redis at "
            "the end (~0.7 s). Its steady state is faster than the script's: with a warm worker the same job takes "
            "~55.6 s from enqueue to the last record (1.3). A job of a minute shows the fixed cost, one of hours "
            "does not. What would close it: workers that import less before their first task (genfleet.cli loads "
            "every command's modules), or pools kept warm between jobs.")


def enqueue_note(end_to_end_per_s: float, enqueue_alone_per_s: float) -> str:
    return (f"`genfleet enqueue` managed {end_to_end_per_s:,.0f} prompts/s with "
            f"process start and tokenizer load, {enqueue_alone_per_s:,.0f}/s for the enqueue itself; profile the "
            "producer (`py-spy record -- .venv/bin/python bench/enqueue_rate.py`) for templating vs publishing.")


def scaling_note(hosts: int, occupancy: float, own_cores: float, busy_cores: float) -> str:
    return (f"With {hosts} hosts the fleet's own processes used {own_cores:.2f} cores and the machine was "
            f"{busy_cores:.2f} of {os.cpu_count()} cores busy; occupancy per host fell to {occupancy:.1%}. On this "
            f"box the hosts are simulated on the same CPUs as the workers: a worker that gets less CPU "
            f"refills its slots later. Real hosts bring their own CPUs; what would fix it here is a "
            f"quieter machine, or the per-task CPU savings listed under CPU per token.")



def affinity_note(hosts: int, affinity_cached: float, least_busy_cached: float) -> str:
    best = (1 - CACHEABLE_SHARE) / (1 - least_busy_cached)
    reach = (f"so even routing that missed nothing would prefill {best:.2f}× least-busy's: 0.5× is out of reach "
             f"at {hosts} hosts on this workload" if best > 0.5 else
             f"so routing that missed nothing would prefill {best:.2f}× least-busy's: affinity missed "
             f"{CACHEABLE_SHARE - affinity_cached:.0%} of the prompt tokens a cache could have served")
    return (
        f"With {hosts} hosts least-busy routing already found {least_busy_cached:.0%} of the prompt tokens in a "
        f"host's cache by chance, affinity {affinity_cached:.0%}. This workload can take at most about "
        f"{CACHEABLE_SHARE:.0%} of its prompt tokens from a cache (3 of each prompt's 4 samples, and each "
        f"conversation's turns 2 and 3 up to the previous reply: `bench/affinity.py`), {reach}. Where affinity "
        f"lost its cache before a warm prompt waited for its host (records of a 4-host run, 2026-12-01): 62 of "
        f"1,200 samples and 23 of 300 turns spilled to a cold host, ~15% of the prompt tokens prefilled; samples "
        f"meeting in one prefill batch cost 0.8%, and holding a prompt's later samples back until the first "
        f"one's first token gained nothing measurable, so it was not kept."
    )


def kv_limited_note(real: dict) -> str:
    """Why staged caps and `--in-flight auto` fell short of 1.5× on the KV-limited server."""
    shape = real["shapes"]["kv-limited"]
    configs, total = shape["configs"], shape["max_total_tokens"]
    base, staged, both = configs["full cap, fixed 150"], configs["staged, fixed 150"], configs["staged, auto"]
    held = staged["token_usage"] * total / max(staged["running"], 1)  # KV in use per running request
    wanted = 1.5 * base["running"]
    extra_prefill = staged["prefilled_tokens"] - base["prefilled_tokens"]
    return (f"Staged caps alone: {staged['tokens_per_s_ratio']:.2f}× the defaults' tok/s (running "
            f"{base['running']:.0f} → {staged['running']:.0f}, KV in use {base['token_usage']:.0%} → "
            f"{staged['token_usage']:.0%}, time to first token p50 {base['ttft_p50_s']:.1f} → "
            f"{staged['ttft_p50_s']:.1f} s); with `--in-flight auto` too: {both['tokens_per_s_ratio']:.2f}× (waiting "
            f"{staged['waiting']:.0f} → {both['waiting']:.0f}: the batch is the server's either way). With staged caps "
            f"the reservations no longer bound the batch, the KV in use does: the running requests are the long ones "
            f"(a short one leaves the batch soon), each holding ~{held:,.0f} tokens, so 1.5× the defaults' batch "
            f"({wanted:.0f} running) would need {wanted * held / total:.0%} of the {total:,}-token cache in use. "
            f"The follow-ups prefilled {extra_prefill:,} more prompt tokens than the defaults "
            f"({extra_prefill / max(staged['requests'] - real['prompts'], 1):,.0f} each: about a whole prefix, so the "
            "full cache had mostly evicted it by the time the follow-up came back through the queue). "
            + _ratio_note(base) +
            "Staged caps gain most where the reservations, not the use, bound the batch: the 4,000 cap on ~300-token "
            "outputs that ran 7 of 150 at 11% KV use, or a server that often goes idle (its ratio back at 0.7); this "
            f"shape, the seeds' lengths with SGLang's clip of the reservation at 4,096 (512 scaled), already used "
            f"{base['token_usage']:.0%} at the full cap.")


def _ratio_note(base: dict) -> str:
    """When SGLang's new_token_ratio reached its floor in the defaults' run, if it was read."""
    points = base.get("ratio_over_time") or []
    floor = min((value for _, value in points), default=None)
    if floor is None:
        return ""
    reached = next(at for at, value in points if value <= floor)
    return (f"SGLang's new_token_ratio fell to {floor:.2f} by {reached} s of the defaults' {base['wall_s']:.0f} s "
            "(0.5.23 `new_token_ratio_tracker.py`: 0.7 falls to 0.098 over `SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS` "
            "decode steps, and starts again only when the server is idle), so on a busy server a running request "
            "is charged about a tenth of its remaining cap: the full cap's reservations mostly fade by themselves. ")


def over_provisioned_note(real: dict) -> str:
    """Why `--in-flight auto` fell short of 1.2× on the over-provisioned server."""
    configs = real["shapes"]["over-provisioned"]["configs"]
    base, auto = configs["full cap, fixed 150"], configs["full cap, auto"]
    targets = " ".join(f"{t}s:{v}" for t, v in auto["target_over_time"][:4])
    decode = auto.get("decode_rate_ratio")
    return (f"`--in-flight auto`'s target went {targets} (its ceiling: 400, every prompt of the run at once), "
            f"running {base['running']:.0f} → {auto['running']:.0f}"
            + (f", and the server decoded {decode:.2f}× as fast while work waited" if decode else "")
            + f"; the wall went {base['wall_s']:.0f} → {auto['wall_s']:.0f} s. With 400 prompts the wall is the "
            "drain: the last completions, up to the cap (1,280 tokens, one per decode step whatever the batch), "
            "decode on after the rest are done, so a bigger batch shortens the start of the run, not its end. A "
            "job with its queue full for hours sees the decode rate's ratio, not the wall's.")


def vllm_occupancy_note(tp: dict) -> str:
    fleet, base = tp["genfleet"], tp["baseline"]
    completions_per_s = fleet["records"] / fleet["wall_s"]
    gap = SLOTS - fleet["steady_running"]
    return (
        f"Both clients keep 150 requests open and the server counts {fleet['steady_running']:.1f} and "
        f"{base['steady_running']:.1f} of them running with {fleet['mean_waiting']:.1f} waiting: the same "
        f"{gap:.1f} slots are missing for the script, so they are not the worker's. vLLM sets its running gauge "
        "after a step's finished requests are freed and before the next step admits their replacements "
        "(0.32.0 `v1/core/sched/scheduler.py` `update_from_output` → `make_stats`), so a finished request's slot "
        "reads empty for a step even when its successor is already waiting; and a new request spends its input "
        f"processing in the API server before the engine counts it. At {completions_per_s:.0f} completions/s "
        f"that is {1e3 * gap / completions_per_s:.0f} ms per completion on this 2-core box, where a completion "
        f"lasts ~{SLOTS / completions_per_s:.0f} s; on a GPU server whose completions last minutes the same "
        "handover is a fraction of a percent. Not the client's to fix: measure it where the API server has "
        "cores of its own."
    )


def vllm_throughput_note(tp: dict) -> str:
    return (
        f"Both sides generated the same tokens with the server equally full (steady running "
        f"{tp['genfleet']['steady_running']:.1f} vs {tp['baseline']['steady_running']:.1f}): the server bounds "
        "the run, and the ratio moves around 1.0 with this box's noise. Where genfleet loses is the start: its "
        "worker fills its 150 slots in ~1.2 s where the script opens 150 streams at once (a task costs the "
        "worker's event loop a few ms of a core that the server is using), so by 10% of the tokens it is ~0.8 s "
        "behind; it gains ~3% in the steady state (the worker asks for `stream_interval` 32 and parses a chunk "
        "per 32 tokens, the script a chunk per token, and the server's API process sends fewer). Before the "
        "worker took waiting messages in batches the fill took ~4 s, and this row read 0.97x."
    )


def sweep_note(server_key: str, name: str, cell: dict) -> str:
    """A sweep cell where auto missed, read from the server's own counters: what auto ran at against
    the best fixed point. `server_key`: the half's server ("sglang" or "vllm"), whose word for a
    request whose KV ran out mid-decode is its own (SGLang retracts, vLLM preempts)."""
    auto, best = cell["modes"]["auto"], cell["modes"][cell["best_fixed"]]
    raised = cell["ratios"]["auto, ceiling 400"]
    why = [f"auto {auto['decode_rate']:,.0f} steady tok/s at {auto['running']:.0f} running, {cell['best_fixed']} "
           f"{best['decode_rate']:,.0f} at {best['running']:.0f}"]
    if best["running"] > auto["running"] * 1.1 and cell["best_fixed"] in ("fixed 256", "fixed 400"):
        why.append(f"the best point runs {best['running']:.0f} at once, above the pool's 150 that auto works under "
                   f"(with the ceiling raised to 400 auto reaches {raised['best_fixed']:.2f}× of it)")
    if auto["waiting"] < 1 and best["waiting"] >= 1:
        why.append(f"auto kept {auto['waiting']:.1f} waiting where the best kept {best['waiting']:.0f}: the server "
                   "sometimes ran out of queued work between steps")
    if auto["retracted"] > best["retracted"]:
        shed = "vLLM preempted" if server_key == "vllm" else "SGLang retracted"
        why.append(f"{shed} {auto['retracted']} under auto against {best['retracted']}")
    spread = max(m["max"] / m["min"] - 1 for m in cell["modes"].values() if m["min"])
    why.append(f"runs of one mode spread by up to {spread:.0%} on this machine")
    return f"{name}: " + "; ".join(why) + "."
