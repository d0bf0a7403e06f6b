"""Admission on SGLang 0.5.23's own scheduler: staged first caps (`--first-max-new-tokens auto`)
and `--in-flight auto` against the defaults (the full cap, 150 in flight), on a KV-limited server
and an over-provisioned one, beside `genfleet sim`'s KV-reservation model (sim.capacity) on the
same prompts.

    .venv/bin/python -m bench.real_server --only admission [--quick]

The step time is a model. The forward patch (`tests/sglang_real/forward_patch.py`,
`GENFLEET_PLAN_STEP_S`) sleeps STEP_S per forward pass on top of the CPU engine's own time: a
fixed part (a GPU's decode step is mostly reading the weights), a part per request in the batch and
a part per prefilled token. What is SGLang's own is everything the step time does not decide: which
requests the scheduler admits (it reserves KV for each request's `min(max_new_tokens, 4096)`,
`managers/schedule_policy.py` `PrefillAdder.add_one_req`), how many wait, what it retracts, and the
token-exact continuation of a cut completion.

The workload is the seeds' length shape (lognormal, median 646 and mean 1,416 tokens, cap 10,240),
scaled by LENGTH_SCALE in tokens so that a run takes a minute, not an hour; so are the caps, the
first cap's start, the KV sizes and SGLang's own estimation clip (`SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION`,
4,096 -> 512), so every reservation the scheduler weighs keeps its proportion to the lengths. Steps
per completion shrink by the same factor, and so do the decode steps over which SGLang's
new_token_ratio decays (`SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS`, 600 -> 75); the in-flight
controller's intervals do not.

Per configuration: tokens/s (the records' completion tokens over the wall time, and the server's
decode rate while it still had work waiting: from 10% to 80% of the tokens it decoded), the server's
running and waiting requests and token usage (`/v1/loads` every 0.5 s, over the middle 80% of the
run), its retractions, tokens decoded beyond the records' (decoded twice: retracted or cut work) and
prompt tokens prefilled, the records' time to first token (p50 / p95), the worker's in-flight
target and first cap over time (its beacon), and the scheduler's new_token_ratio over time. Every
record is compared, token for token, with the defaults' record of the same prompt.
"""
from __future__ import annotations

import json
import math
import os
import random
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis

from bench.processes import Processes, env_for, genfleet, redis_client

LENGTH_SCALE = 1 / 8
FULL_CAP = round(10_240 * LENGTH_SCALE)  # 1,280
ESTIMATION_CLIP = round(4096 * LENGTH_SCALE)  # SGLang's CLIP_MAX_NEW_TOKENS, scaled alike: 512
FIRST_CAP_START = round(1024 * LENGTH_SCALE)  # the first_cap_start setting's default, scaled: 128
# SGLang's new_token_ratio falls from 0.7 to 0.098 over this many decode steps (600:
# SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS, 0.5.23 `managers/scheduler_components/new_token_ratio_tracker.py`),
# scaled alike: a completion takes 1/8 of the steps here, and so does the fading of the reservation
# its running requests make, which in a real job is over in the first completion's time.
RATIO_DECAY_STEPS = round(600 * LENGTH_SCALE)  # 75
# A fixed 30 ms (the weights read once per step), 0.1 ms per request in the batch, 20 us per
# prefilled token (50,000 prompt tokens/s).
STEP_S = (0.030, 0.0001, 0.00002)
SHAPES = {
    # The full cap admits ~40 of 150 (calibrated on this tier: 40 running, 82 waiting, 84% used).
    "kv-limited": 12_000,
    # Room for ~400 requests at the full cap: prompt (~30) + the clipped 512, 400 times.
    "over-provisioned": 220_000,
}
CEILING = 400  # the pool's ceiling under `--in-flight auto` (--concurrency): the operator raises it
FIXED = 150


@dataclass(frozen=True)
class Config:
    name: str
    staged: bool
    auto: bool


CONFIGS = (
    Config("full cap, fixed 150", staged=False, auto=False),  # the defaults
    Config("full cap, auto", staged=False, auto=True),
    Config("staged, fixed 150", staged=True, auto=False),
    Config("staged, auto", staged=True, auto=True),
)
DEFAULTS = CONFIGS[0].name


def rows(count: int, seed: int = 3) -> list[dict]:
    """Chat prompts whose plans have the seeds' lengths, scaled (70% reasoning, as the sim's)."""
    rng = random.Random(seed)
    sigma = math.sqrt(2 * math.log(1416 / 646))
    out = []
    for i in range(count):
        length = min(FULL_CAP + 200, max(4, round(rng.lognormvariate(math.log(646), sigma) * LENGTH_SCALE)))
        think = max(1, round(length * 0.7))
        out.append({"id": f"a{i:05d}", "messages": [
            {"role": "user", "content": f"question {i}: tell me about the fleet [plan len={length - think} "
                                        f"think={think}]"}]})
    return out


# -- one run ----------------------------------------------------------------------------------------

class Timeline:
    """Every 0.5 s while a run goes: the server's load and decode counter, the worker's target and
    first cap (its beacon)."""

    def __init__(self, url: str, counters: Path | None, client: redis.Redis, run: str, kind: str) -> None:
        self.url, self.counters, self.client, self.run, self.kind = url, counters, client, run, kind
        self.points: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self.started = time.monotonic()

    def __enter__(self) -> Timeline:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        from genfleet.common.fleet_stats import read_beacons

        while not self._stop.is_set():
            point: dict = {"t": time.monotonic() - self.started}
            try:
                point.update(_vllm_point(self.url) if self.kind == "vllm" else self._sglang_point())
                for beacon in read_beacons(self.client):
                    for upstream in beacon.upstreams:
                        if upstream.url == self.url and upstream.target:
                            point["target"] = upstream.target
                    cap = beacon.first_caps.get(self.run, {}).get("d")
                    if cap:
                        point["first_cap"] = cap
            except (httpx.HTTPError, KeyError, ValueError, OSError, redis.RedisError):
                pass
            self.points.append(point)
            self._stop.wait(0.5)

    def _sglang_point(self) -> dict[str, float]:
        """SGLang's `/v1/loads`, and its decode count and new_token_ratio: the tier plan's counters
        ("real") or the simulator's own ("sim")."""
        load = httpx.get(f"{self.url}/v1/loads", timeout=5).json()["loads"][0]
        point = {"running": load["num_running_reqs"], "waiting": load["num_waiting_reqs"],
                 "usage": load["token_usage"], "retracted": (load.get("queues") or {}).get("retracted", 0)}
        if self.kind == "real":
            if self.counters and self.counters.exists():
                point["decoded"] = json.loads(self.counters.read_text())["decoded_tokens"]
            if (ratio := _new_token_ratio(httpx.get(f"{self.url}/metrics", timeout=5).text)) is not None:
                point["ratio"] = ratio
        else:
            stats = httpx.get(f"{self.url}/sim/stats", timeout=5).json()
            point["decoded"], point["ratio"] = stats["tokens_generated"], stats["new_token_ratio"]
        return point

    def middle(self, key: str) -> float:
        """The mean of `key` over the middle 80% of the run."""
        end = self.points[-1]["t"] if self.points else 0.0
        inside = [p[key] for p in self.points if key in p and 0.1 * end <= p["t"] <= 0.9 * end]
        return statistics.fmean(inside) if inside else 0.0

    def decode_rate(self) -> float:
        return steady_decode_rate([(p["t"], p["decoded"]) for p in self.points if "decoded" in p])

    def over_time(self, key: str, every_s: float = 10.0, digits: int = 0) -> list[tuple[int, float]]:
        """(second, value) every `every_s` seconds of the run, where the key was seen."""
        out, next_at = [], 0.0
        for point in self.points:
            if key in point and point["t"] >= next_at:
                out.append((round(point["t"]), round(point[key], digits) if digits else round(point[key])))
                next_at = point["t"] + every_s
        return out


def steady_decode_rate(points: list[tuple[float, int]]) -> float:
    """Tokens/s the server decoded from 10% to 80% of what it decoded in a run ((seconds, decoded so
    far) readings): its pace while it still had work waiting, before the long tail drains alone and
    after the start-up. bench/sweep.py reads the offline engine's the same way."""
    if len(points) < 3:
        return 0.0
    first, last = points[0][1], points[-1][1]
    low = next((p for p in points if p[1] - first >= 0.1 * (last - first)), points[0])
    high = next((p for p in points if p[1] - first >= 0.8 * (last - first)), points[-1])
    return (high[1] - low[1]) / (high[0] - low[0]) if high[0] > low[0] else 0.0


def _new_token_ratio(metrics: str) -> float | None:
    """SGLang's `sglang:new_token_ratio` gauge (`--enable-metrics`; 0.5.23
    `observability/metrics_collector.py`, set at each prefill batch, 0 before the first) from a
    /metrics page."""
    for line in metrics.splitlines():
        if line.startswith("sglang:new_token_ratio"):
            return float(line.rsplit(" ", 1)[1]) or None
    return None


def _vllm_point(url: str) -> dict[str, float]:
    """A Timeline point from vLLM's `/metrics` (workers/servers/vllm.py reads the page as the
    worker does): running, waiting, KV use, and the tokens it generated so far as `decoded`.
    vLLM counts preemptions since it started, not at the last one: the run's are counted from
    `server_counters` before and after, not per point."""
    from genfleet.workers.servers.vllm import METRICS_PATH, read_metrics_page

    page = read_metrics_page(httpx.get(f"{url}{METRICS_PATH}", timeout=5).raise_for_status().text)
    return {"running": page.running, "waiting": page.waiting, "usage": page.kv_usage,
            "decoded": page.generated_tokens}


def server_counters(kind: str, url: str, counters: Path | None) -> dict[str, int]:
    if kind == "vllm":
        from genfleet.workers.servers.vllm import METRICS_PATH, read_metrics_page

        page = read_metrics_page(httpx.get(f"{url}{METRICS_PATH}", timeout=5).raise_for_status().text)
        return {"decoded_tokens": int(page.generated_tokens), "preemptions": int(page.preemptions)}
    if kind == "sim":
        stats = httpx.get(f"{url}/sim/stats", timeout=5).json()
        return {"decoded_tokens": stats["tokens_generated"], "prefilled_tokens": stats["prefill_tokens_computed"]}
    time.sleep(0.5)  # the patch rewrites its file at most every 0.2 s
    return json.loads(counters.read_text()) if counters and counters.exists() else {}


def run_one(procs: Processes, redis_url: str, kind: str, url: str, counters: Path | None, model: Path,
            rows_path: Path, total: int, config: Config, run: str, *, concurrency: int | None = None,
            max_new_tokens: int = FULL_CAP, enqueue_args: tuple[str, ...] = ("--on-truncated", "continue")) -> dict:
    """One worker (`concurrency` in flight, or this measurement's ceiling under auto and FIXED
    without), the rows enqueued (with `enqueue_args`), until every prompt is finished: the run's
    figures and its records' output ids. `kind`: "real" (SGLang with the tier's plan), "vllm" or
    "sim". bench/sweep.py runs it at every fixed point too."""
    from bench.real_tier import finished_prompts, wait_for  # one wait and one progress read for every measurement

    output = procs.dir / f"output-{run}"
    settings: dict[str, object] = {"in_flight_mode": "auto" if config.auto else "fixed",
                                   "concurrency": concurrency or (CEILING if config.auto else FIXED),
                                   "first_cap_start": FIRST_CAP_START}
    env = env_for(redis_url, output, tokenizer=model, **settings)
    worker = procs.start_worker(f"worker-{run}", env, [url])
    procs.wait_ready([worker])
    client = redis_client(redis_url)
    enqueue_flags = ["--max-new-tokens", str(max_new_tokens), *enqueue_args]
    if config.staged:
        enqueue_flags += ["--first-max-new-tokens", "auto"]
    before = server_counters(kind, url, counters)
    with Timeline(url, counters, client, run, kind) as timeline:
        started = time.monotonic()
        enqueue = procs.start(f"enqueue-{run}", genfleet("enqueue", "--run", run, "--tokenizer", str(model),
                                                         "--keep-token-ids", *enqueue_flags, f"d={rows_path}"), env)
        wait_for(lambda: finished_prompts(client, run) >= total, f"genfleet run {run}", worker, enqueue)
        wall_s = time.monotonic() - started
    after = server_counters(kind, url, counters)
    procs.stop(worker)
    records = [json.loads(line) for shard in sorted(output.glob(f"{run}/*/*.jsonl*"))
               for line in shard.read_text().splitlines() if line]
    tokens = sum(r["usage"]["completion_tokens"] for r in records)
    requests = sum(1 + (r.get("continued") or 0) for r in records)
    first_token = sorted(r["timing"]["first_token_s"] for r in records if r["timing"].get("first_token_s"))
    decoded = after.get("decoded_tokens", 0) - before.get("decoded_tokens", 0)
    return {
        "records": len(records), "wall_s": wall_s, "completion_tokens": tokens, "tokens_per_s": tokens / wall_s,
        "decode_rate": timeline.decode_rate(),
        "running": timeline.middle("running"), "waiting": timeline.middle("waiting"),
        "token_usage": timeline.middle("usage"),
        # SGLang's requests retracted at once, at most; vLLM's preemptions over the run.
        "retracted_peak": max((p.get("retracted", 0) for p in timeline.points),
                              default=0) or after.get("preemptions", 0) - before.get("preemptions", 0),
        # Each request's first token comes out of its prefill, the rest out of decode steps: decode
        # rows beyond that were decoded for nothing (retracted work, or past an end).
        "decoded_tokens": decoded, "decoded_twice": decoded - (tokens - requests),
        "prefilled_tokens": after.get("prefilled_tokens", 0) - before.get("prefilled_tokens", 0),
        "continued": sum(1 for r in records if r.get("continued")), "requests": requests,
        "ttft_p50_s": _quantile(first_token, 0.5), "ttft_p95_s": _quantile(first_token, 0.95),
        "target_over_time": timeline.over_time("target"), "first_cap_over_time": timeline.over_time("first_cap"),
        "ratio_over_time": timeline.over_time("ratio", digits=3),
        "outputs": {r["id"]: r.get("output_ids") for r in records},
    }


def _quantile(values: list[float], q: float) -> float | None:
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


# -- the comparison ---------------------------------------------------------------------------------

def sim_flags(total_tokens: int) -> list[str]:
    """The sim's model of the same server: each request decodes 1 / (fixed + per_request x running)
    tokens/s, that is `--rate` 1 / fixed and `--knee` fixed / per_request; prefill per token; the
    same KV size, reserved as SGLang reserves it (sim.capacity, with the same clip: SGLang's
    variable, which the sim reads too). Its lengths are its own draws from the same lognormal, in
    words (a word is a token or a few), so its token totals differ from the plans'."""
    fixed, per_request, per_token = STEP_S
    return ["--rate", f"{1 / fixed:.3f}", "--knee", f"{fixed / per_request:.0f}", "--prefill-rate",
            f"{1 / per_token:.0f}", "--max-total-tokens", str(total_tokens), "--prefix-cache-tokens", "2000000",
            "--length-median", "646", "--length-mean", "1416", "--length-scale", str(LENGTH_SCALE)]


def _start_sim(procs: Processes, total_tokens: int) -> str:
    env = {**os.environ, **sglang_variables()}
    return procs.start_sim("sim-admission", sim_flags(total_tokens), env)[1]


def sglang_variables() -> dict[str, str]:
    """SGLang's own settings of the reservation, scaled with the lengths; the sim reads the same."""
    return {"SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION": str(ESTIMATION_CLIP),
            "SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS": str(RATIO_DECAY_STEPS)}


def measure_admission(kind: str, workload, model: Path, tmp: Path) -> dict:
    """Each shape: a server (real or sim), the four configurations one after the other on it, its
    radix cache flushed between them (the sim: a fresh one each)."""
    from bench.real_tier import write_rows

    count = workload.admission_prompts
    rows_path = write_rows(tmp / "admission.jsonl", rows(count))
    outcome: dict = {"prompts": count, "step_s": STEP_S, "length_scale": LENGTH_SCALE, "shapes": {}}
    for shape, total_tokens in SHAPES.items():
        results: dict[str, dict] = {}
        with Processes(prefix=f"genfleet-bench-admission-{kind}-{shape}-") as procs:
            _, redis_url = procs.start_redis()
            server = None
            if kind == "real":
                server = _real_server(procs, model, total_tokens)
            try:
                for number, config in enumerate(CONFIGS):
                    if server is not None:
                        server.flush_cache()
                        url, counters = server.url, server.extra_env["GENFLEET_PLAN_COUNTERS"]
                    else:
                        url, counters = _start_sim(procs, total_tokens), None
                    results[config.name] = run_one(procs, redis_url, kind, url, Path(counters) if counters else None,
                                                   model, rows_path, count, config, f"adm{number}")
            finally:
                if server is not None:
                    server.stop()
        outcome["shapes"][shape] = _summary(results, total_tokens)
    return outcome


def _real_server(procs: Processes, model: Path, total_tokens: int):
    from bench.real_tier import RealServer, sglang_venv  # puts the tier on sys.path

    counters = procs.dir / "counters.json"
    env = {"GENFLEET_PLAN_COUNTERS": str(counters), "GENFLEET_PLAN_STEP_S": ",".join(map(str, STEP_S)),
           **sglang_variables()}
    # --enable-metrics: the new_token_ratio gauge for the timeline.
    server = RealServer(sglang_venv(), model, "--max-total-tokens", str(total_tokens), "--max-running-requests",
                        str(CEILING + 100), "--enable-cache-report", "--enable-metrics", name="admission", env=env)
    return server.spawn().wait_healthy()


def _summary(results: dict[str, dict], total_tokens: int) -> dict:
    """Each configuration's figures, its ratios to the defaults, and how many of its records are the
    defaults' token for token."""
    outputs = {name: side.pop("outputs") for name, side in results.items()}
    defaults, reference = results[DEFAULTS], outputs[DEFAULTS]
    summary: dict = {"max_total_tokens": total_tokens, "configs": {}}
    for name, side in results.items():
        same = sum(1 for rid, ids in outputs[name].items() if ids is not None and ids == reference.get(rid))
        summary["configs"][name] = {**side, "identical_records": same,
                                    "tokens_per_s_ratio": side["tokens_per_s"] / defaults["tokens_per_s"],
                                    "decode_rate_ratio": (side["decode_rate"] / defaults["decode_rate"]
                                                          if defaults["decode_rate"] else None)}
    return summary
