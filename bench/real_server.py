"""The figures that depend on SGLang's behaviour, measured on SGLang 0.5.23's own server (the
real-server tier's: its CPU engine, only the model's forward pass replaced by the deterministic
plan of `tests/sglang_real/forward_patch.py`), each beside `genfleet sim`'s figure for the same
workload. Where the two disagree, the real one is the one to quote.

    .venv/bin/python -m bench.real_server [--quick] [--only throughput,affinity,loops]

- **throughput**: the same prompts through genfleet (one short worker, 150 in flight) and through
  the baseline script (`bench/baseline_client.py`: asyncio + httpx, 150 at once, the server's
  default stream), one after the other on one server (its radix cache flushed between them).
  Occupancy: the server's own running count (`/v1/loads` `num_running_reqs`, polled every 0.1 s)
  averaged over the middle 80% of the wall time, ÷ 150. On this machine the server's "GPU" is the
  same two cores the client runs on, so a client's CPU slows the server too: the tokens/s here are
  this box's, not a GPU's; the ratio says how much each client takes from the server.
- **affinity**: `--samples 4` of long prompts over two servers, least-busy routing against
  prefix-affinity routing, the caches flushed before each: prompt tokens the servers prefilled,
  counted by the forward patch where the scheduler ran them (the extend rows; what the radix cache
  held is not among them), and from the records' `cached_tokens` (what SGLang reported).
- **loops**: a quarter of the prompts never stop (a repeated period, `[plan loop=3]`), the rest
  stop by themselves; `--loop-guard off` against `--loop-guard abort`: tokens the scheduler
  decoded (the forward patch's count: what a GPU spends, aborts' in-flight steps included), and
  whether every non-looping record came out the same.

The plan decides completions, so the step time is the CPU engine's, not a GPU's: a model of
nothing in particular. What carries over is what the scheduler, the radix cache and the stream
do, which is SGLang's own code.
"""
from __future__ import annotations

import json
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from bench import admission
from bench.processes import REPO, Processes, env_for, genfleet, redis_client
from bench.prompts import _words
from bench.real_tier import (
    RealServer,
    finished_prompts,
    measurement_cli,
    sglang_venv,
    tier_model,
    wait_for,
    write_rows,
)

SLOTS = 150
BASELINE_SCRIPT = REPO / "bench" / "baseline_client.py"
MEASUREMENTS = ("throughput", "affinity", "loops", "admission")


@dataclass(frozen=True)
class Workload:
    throughput_prompts: int = 600
    affinity_prompts: int = 60  # x 4 samples
    affinity_prompt_words: int = 600
    loop_prompts: int = 80  # a quarter loop
    loop_max_new_tokens: int = 1500
    admission_prompts: int = 400  # x 4 configurations x 2 server shapes (bench/admission.py)

    def describe(self) -> str:
        return (f"throughput {self.throughput_prompts} prompts (plans of 60-180 tokens); affinity "
                f"{self.affinity_prompts} prompts of ~{self.affinity_prompt_words} words x 4 samples over 2 servers; "
                f"loops {self.loop_prompts} prompts, a quarter never stopping, max_new_tokens "
                f"{self.loop_max_new_tokens:,}; admission {self.admission_prompts} prompts of the seeds' "
                "length shape (scaled 1/8) x 4 configurations x 2 server shapes")


FULL = Workload()
QUICK = replace(FULL, throughput_prompts=60, affinity_prompts=8, affinity_prompt_words=200, loop_prompts=12,
                loop_max_new_tokens=400, admission_prompts=40)


# -- inputs ---------------------------------------------------------------------------------------

def _text(rng: random.Random, words: list[str], count: int) -> str:
    return " ".join(rng.choices(words, k=count))


def throughput_rows(count: int, seed: int = 0) -> list[dict]:
    rng, words = random.Random(seed), _words()
    return [{"id": f"p{i:05d}", "messages": [{"role": "user", "content": _text(rng, words, rng.randint(8, 40))
                                              + f" [plan len={rng.randint(40, 120)} think={rng.randint(20, 60)}]"}]}
            for i in range(count)]


def affinity_rows(count: int, words_each: int, seed: int = 1) -> list[dict]:
    rng, words = random.Random(seed), _words()
    return [{"id": f"s{i:04d}", "messages": [{"role": "user", "content": _text(rng, words, words_each)
                                              + " [plan len=20 think=10]"}]} for i in range(count)]


def loop_rows(count: int, seed: int = 2) -> list[dict]:
    rng, words = random.Random(seed), _words()
    return [{"id": f"l{i:04d}", "messages": [{"role": "user", "content": _text(rng, words, 12) + (
        " [plan loop=3]" if i % 4 == 0 else f" [plan len={rng.randint(40, 120)} think=30]")}]} for i in range(count)]


# -- the servers ----------------------------------------------------------------------------------

class Hosts:
    """`count` real servers (or simulators) and what they report: load samples, counters."""

    def __init__(self, procs: Processes, kind: str, count: int, model: Path, sim_flags: list[str] = ()) -> None:
        self.kind = kind
        self.servers: list[RealServer] = []
        self.urls: list[str] = []
        self.counter_files: list[Path] = []
        if kind == "real":
            venv = sglang_venv()
            for i in range(count):
                counters = procs.dir / f"counters-{i}.json"
                server = RealServer(venv, model, "--enable-cache-report", name=f"real{i}",
                                    env={"GENFLEET_PLAN_COUNTERS": str(counters)})
                self.servers.append(server.spawn())
                self.counter_files.append(counters)
            for server in self.servers:
                server.wait_healthy()
            self.urls = [server.url for server in self.servers]
        else:
            for i in range(count):
                _, url = procs.start_sim(f"sim{i}", ["--prefix-cache-tokens", "2000000",
                                                     "--enable-cache-report", *sim_flags])
                self.urls.append(url)

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def flush_caches(self) -> None:
        """Empty every radix cache, so a run inherits no prefix from the one before (the real servers
        only: a simulator has no flush, so a measurement that needs one starts fresh simulators)."""
        for server in self.servers:
            server.flush_cache()

    def counters(self) -> dict[str, int]:
        """What the hosts computed, summed: the forward patch's counts (real), `/sim/stats` (sim)."""
        if self.kind != "real":
            stats = [httpx.get(f"{url}/sim/stats", timeout=5).json() for url in self.urls]
            return {"decoded_tokens": sum(s["tokens_generated"] for s in stats),
                    "prefilled_tokens": sum(s["prefill_tokens_computed"] for s in stats)}
        time.sleep(0.5)  # the patch rewrites its file at most every 0.2 s
        total: dict[str, int] = {}
        for path in self.counter_files:
            if path.exists():
                for name, value in json.loads(path.read_text()).items():
                    total[name] = total.get(name, 0) + value
        return total

    def load(self) -> dict[str, float]:
        """The hosts' running requests, summed."""
        if self.kind == "real":
            return {"running": sum(httpx.get(f"{url}/v1/loads", timeout=5).json()["loads"][0]["num_running_reqs"]
                                   for url in self.urls)}
        return {"running": sum(httpx.get(f"{url}/sim/stats", timeout=5).json().get("running", 0)
                               for url in self.urls)}


class LoadSampler:
    """The hosts' load (`load()`: running requests, and waiting where the server says) every 0.1 s,
    in a thread, while a side runs."""

    def __init__(self, hosts) -> None:  # Hosts, or anything with its `load()`
        self.hosts = hosts
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.monotonic(), self.hosts.load()))
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            self._stop.wait(0.1)

    def mean(self, name: str, start: float, end: float) -> float:
        """`name`'s mean over the middle 80% of [start, end]."""
        lo, hi = start + 0.1 * (end - start), start + 0.9 * (end - start)
        inside = [load.get(name, 0.0) for at, load in self.samples if lo <= at <= hi]
        return sum(inside) / len(inside) if inside else 0.0

    def mean_in_progress(self, name: str, counter: str, lo: float = 0.1, hi: float = 0.5) -> float | None:
        """`name`'s mean while `counter` (a count the hosts keep, such as the tokens they generated)
        went from `lo` to `hi` of what it grew by over the samples: a side's steady state, its ramp
        and its drain left out (with more prompts than slots, the queue still holds prompts at
        `hi`). None where the hosts keep no such count."""
        counts = [load[counter] for _, load in self.samples if counter in load]
        if len(counts) < 2 or counts[-1] <= counts[0]:
            return None
        start, grown = counts[0], counts[-1] - counts[0]
        inside = [load[name] for _, load in self.samples
                  if counter in load and lo <= (load[counter] - start) / grown <= hi]
        return sum(inside) / len(inside) if inside else None


# -- one run of genfleet, one of the baseline ---------------------------------------------------------

def run_genfleet(procs: Processes, redis_url: str, hosts: Hosts, model: Path, run: str, rows_path: Path,
                 total: int, enqueue_args: tuple[str, ...] = (), **settings: object) -> dict:
    """One run (its own run name) through a fresh worker, on the measurement's one redis-server."""
    output = procs.dir / f"output-{run}"
    env = env_for(redis_url, output, tokenizer=model, **settings)
    worker = procs.start_worker(f"worker-{run}", env, hosts.urls)
    procs.wait_ready([worker])
    client = redis_client(redis_url)
    before = hosts.counters()
    with LoadSampler(hosts) as sampler:
        started = time.monotonic()
        enqueue = procs.start(f"enqueue-{run}", genfleet("enqueue", "--run", run, "--tokenizer", str(model),
                                                         "--keep-token-ids", *enqueue_args, f"d={rows_path}"), env)
        wait_for(lambda: finished_prompts(client, run) >= total, f"genfleet run {run}", worker, enqueue)
        ended = time.monotonic()
    after = hosts.counters()
    procs.stop(worker)
    records = [json.loads(line) for shard in sorted(output.glob(f"{run}/*/*.jsonl*"))
               for line in shard.read_text().splitlines() if line]
    return _side(records, ended - started, sampler, started, before, after)


def run_baseline(procs: Processes, hosts: Hosts, model: Path, rows_path: Path, max_new_tokens: int,
                 *flags: str) -> dict:
    """The script; `flags`: `--api completions` for vLLM's OpenAI server, say."""
    out = procs.dir / "baseline.jsonl"
    before = hosts.counters()
    with LoadSampler(hosts) as sampler:
        started = time.monotonic()
        child = procs.start("baseline", [sys.executable, str(BASELINE_SCRIPT), "--url", hosts.urls[0], "--tokenizer",
                                         str(model), "--prompts", str(rows_path), "--out", str(out),
                                         "--concurrency", str(SLOTS), "--max-new-tokens", str(max_new_tokens),
                                         *flags])
        wait_for(lambda: child.process.poll() is not None, "baseline", None, None)
        ended = time.monotonic()
    if child.process.returncode != 0:
        raise RuntimeError(f"baseline failed:\n{child.tail()}")
    after = hosts.counters()
    records = [json.loads(line) for line in out.read_text().splitlines() if line]
    for record in records:
        record.setdefault("usage", {"completion_tokens": record["completion_tokens"]})
    return _side(records, ended - started, sampler, started, before, after)


def _side(records: list[dict], wall_s: float, sampler: LoadSampler, started: float, before: dict,
          after: dict) -> dict:
    tokens = sum(r["usage"]["completion_tokens"] for r in records)
    return {"records": len(records), "wall_s": wall_s, "completion_tokens": tokens, "tokens_per_s": tokens / wall_s,
            "mean_running": sampler.mean("running", started, started + wall_s),
            "mean_waiting": sampler.mean("waiting", started, started + wall_s),
            "steady_running": sampler.mean_in_progress("running", "generated"),
            "prompt_tokens": sum(r["usage"].get("prompt_tokens", 0) for r in records),
            "cached_tokens": sum(r["usage"].get("cached_tokens") or 0 for r in records),
            "server": {name: after.get(name, 0) - before.get(name, 0) for name in after},
            "texts": {r["id"]: (r.get("reasoning"), r.get("content"), r.get("finish_reason")) for r in records}}


def _public(side: dict) -> dict:
    return {key: value for key, value in side.items() if key != "texts"}


# -- the three comparisons ------------------------------------------------------------------------

def measure_throughput(kind: str, workload: Workload, model: Path, tmp: Path) -> dict:
    rows = write_rows(tmp / "throughput.jsonl", throughput_rows(workload.throughput_prompts))
    # The sim's lengths drawn over the plans' range (60-180 tokens), its default speed otherwise.
    with Processes(prefix=f"genfleet-bench-real-{kind}-") as procs:
        hosts = Hosts(procs, kind, 1, model, ["--length-tokens", "60:180", "--rate", "350", "--knee", "64"])
        try:
            fleet = run_genfleet(procs, procs.start_redis()[1], hosts, model, "tp", rows, workload.throughput_prompts,
                                 ("--max-new-tokens", "2048"))
            hosts.flush_caches()
            baseline = run_baseline(procs, hosts, model, rows, 2048)
        finally:
            hosts.stop()
    return {"genfleet": _public(fleet), "baseline": _public(baseline),
            "throughput_ratio": fleet["tokens_per_s"] / baseline["tokens_per_s"],
            "occupancy": fleet["mean_running"] / SLOTS, "baseline_occupancy": baseline["mean_running"] / SLOTS,
            "same_tokens": fleet["completion_tokens"] == baseline["completion_tokens"]}


def measure_affinity(kind: str, workload: Workload, model: Path, tmp: Path) -> dict:
    rows = write_rows(tmp / "affinity.jsonl", affinity_rows(workload.affinity_prompts, workload.affinity_prompt_words))
    total = workload.affinity_prompts * 4
    results = {}
    flags = ["--length-tokens", "30:40", "--rate", "200", "--knee", "64", "--prefill-rate", "20000"]
    with Processes(prefix=f"genfleet-bench-real-affinity-{kind}-") as procs:
        _, redis_url = procs.start_redis()
        shared = Hosts(procs, kind, 2, model, flags) if kind == "real" else None
        try:
            for mode in ("least-busy", "affinity"):
                hosts = shared or Hosts(procs, kind, 2, model, flags)
                hosts.flush_caches()
                side = run_genfleet(procs, redis_url, hosts, model, mode.replace("-", ""), rows, total,
                                    ("--samples", "4", "--temperature", "1", "--max-new-tokens", "256"), routing=mode)
                side["prefilled_tokens"] = side["server"].get("prefilled_tokens",
                                                              side["prompt_tokens"] - side["cached_tokens"])
                results[mode] = _public(side)
        finally:
            if shared:
                shared.stop()
    a, b = results["affinity"], results["least-busy"]
    reported = [side["prompt_tokens"] - side["cached_tokens"] for side in (a, b)]
    return {**results, "prefill_ratio": a["prefilled_tokens"] / b["prefilled_tokens"],
            "reported_prefill_ratio": reported[0] / reported[1],
            "wall_ratio": a["wall_s"] / b["wall_s"]}


def measure_loops(kind: str, workload: Workload, model: Path, tmp: Path) -> dict:
    rows = write_rows(tmp / "loops.jsonl", loop_rows(workload.loop_prompts))
    results, texts = {}, {}
    with Processes(prefix=f"genfleet-bench-real-loops-{kind}-") as procs:
        _, redis_url = procs.start_redis()
        hosts = Hosts(procs, kind, 1, model, ["--length-tokens", "70:150", "--loop-rate", "0.25", "--rate", "350",
                                             "--knee", "64"])
        try:
            for policy in ("off", "abort"):
                side = run_genfleet(procs, redis_url, hosts, model, f"loop{policy}", rows, workload.loop_prompts,
                                    ("--loop-guard", policy, "--max-new-tokens", str(workload.loop_max_new_tokens)))
                side["decoded_tokens"] = side["server"].get("decoded_tokens", side["completion_tokens"])
                texts[policy] = side["texts"]
                results[policy] = _public(side)
        finally:
            hosts.stop()
    stopped = [i for i, (_, _, finish) in texts["off"].items() if finish == "stop"]
    same = all(texts["off"][i] == texts["abort"].get(i) for i in stopped)
    looped = sum(1 for _, _, finish in texts["abort"].values() if finish == "loop")
    return {**results, "decoded_ratio": results["abort"]["decoded_tokens"] / results["off"]["decoded_tokens"],
            "wall_ratio": results["abort"]["wall_s"] / results["off"]["wall_s"],
            "stopped_records_identical": same, "stopped": len(stopped), "looped": looped}


MEASURE = {"throughput": measure_throughput, "affinity": measure_affinity, "loops": measure_loops,
           "admission": admission.measure_admission}


def compare(workload: Workload, only: tuple[str, ...] = MEASUREMENTS, log: Callable[[str], None] = print) -> dict:
    """Each measurement on the real server, then on the simulator, with the same inputs."""
    import tempfile

    outcome: dict = {"workload": workload.describe(), "sglang": "0.5.23", "measurements": {}}
    with tempfile.TemporaryDirectory(prefix="genfleet-bench-real-") as tmp_name:
        tmp = Path(tmp_name)
        model = tier_model.build(tmp / "model")
        for name in only:
            figures = {}
            for kind in ("real", "sim"):
                log(f"  {name} on {'SGLang 0.5.23' if kind == 'real' else 'genfleet sim'}")
                figures[kind] = MEASURE[name](kind, workload, model, tmp)
            outcome["measurements"][name] = figures
    return outcome


def main() -> None:
    measurement_cli(__doc__, MEASUREMENTS, compare, QUICK, FULL)


if __name__ == "__main__":
    main()
