"""Prefix-cache-aware routing against least-busy routing, over 2 and 4 simulated hosts.

    .venv/bin/python -m bench.affinity [--quick] [--hosts 2,4]

The workload shares prefixes the way real jobs do: `--samples 4` of long prompts (each sample
repeats its prompt) and conversations regenerated turn by turn (`--regenerate all`: each turn's
prompt extends the previous one), two runs served by one fleet at once. Each host models SGLang's
radix prefix cache (`genfleet sim --prefix-cache-tokens`) and its scheduler: requests are
prefilled in FCFS batches of their uncached tokens, one batch at a time, and nobody decodes while
a batch runs (sim/capacity.py), so prefill a host's cache saves is GPU time every request gets
back, as on SGLang.

The capacity is a 70B model on one 8-GPU H200 node (TP8), estimated from the hardware:
- prefill ~20,000 prompt tokens/s per server: ~141 GFLOP a token (2 x 70.6e9 parameters) against
  8 x 989 TFLOP/s (bf16, dense) at ~35 % utilisation, TP8's all-reduces included: the upper end
  of the 10-20k tokens/s such a server is usually credited with, so as not to inflate prefill's
  share;
- decode ~100 tok/s for a lone request (17.5 GB of weights per GPU read each step at 4.8 TB/s,
  plus 160 all-reduces), ~75 tok/s each at 150 running (the KV cache read grows with the batch):
  `rate / (1 + running / knee)` with knee 450, ~11,000 tok/s per server.
Time runs 3x slower here (rates / 3: ~3,750 decode tok/s per host at 150 running, 6,667 prefill)
so that the one worker and the simulators, sharing 2 cores, stream every token without becoming
the bottleneck (the hosts' mean running count shows it: ~150 per host). The ratios do not depend
on that scale. With these ~1,500-token prompts and 100-300-token completions, prefill is most of
the GPU's time unless the cache serves the prompt: `prefill_share` (the hosts' prefill seconds
over their wall time) shows how much; longer completions (reasoning) would make it smaller and
affinity's wall-time gain with it.

Per routing mode and host count, on fresh simulators: the prompt tokens the hosts had to prefill
(`/sim/stats` `prefill_tokens_computed`, summed), the wall time from the first enqueue to the last
record counted, the hosts' mean running count over the whole job, and their prefill share.
"""
from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import redis

from bench.processes import TOKENIZER, Processes, env_for, genfleet, redis_client
from bench.prompts import _words

POLL_S = 0.1
RUN_TIMEOUT_S = 900.0
MODES = ("least-busy", "affinity")


@dataclass(frozen=True)
class Workload:
    prompts: int  # sampled 4 times each
    conversations: int  # of `turns` user turns, each reply regenerated
    prompt_words: int  # about one token each
    turns: int = 3
    samples: int = 4
    # A 70B model on an H200 node, 3x slower (the module's docstring): at 150 running a request
    # decodes 25 tok/s, 200 tokens in 8 s; a host prefills an uncached 1,500-token prompt in 0.22 s,
    # a batch of 16,384 tokens in 2.5 s, while its 150 running requests wait.
    rate: float = 100 / 3
    knee: float = 450.0
    prefill_rate: float = 20_000 / 3

    def sim_flags(self) -> list[str]:
        return ["--rate", f"{self.rate:.2f}", "--knee", f"{self.knee:g}", "--length-tokens", "100:300",
                "--prefill-rate", f"{self.prefill_rate:.0f}", "--prefix-cache-tokens", "2000000"]

    @property
    def requests(self) -> int:
        return self.prompts * self.samples + self.conversations * self.turns

    def describe(self) -> str:
        return (f"{self.prompts} prompts of ~{self.prompt_words} tokens x {self.samples} samples, and "
                f"{self.conversations} conversations of {self.turns} turns regenerated in order (a ~{self.prompt_words}"
                f"-token system prompt each): {self.requests} requests; `genfleet sim {' '.join(self.sim_flags())}`")


FULL = Workload(prompts=300, conversations=150, prompt_words=1500)
QUICK = Workload(prompts=20, conversations=10, prompt_words=400, rate=1000.0, prefill_rate=200_000.0)


@dataclass(frozen=True)
class RoutingResult:
    mode: str
    hosts: int
    wall_s: float
    prefill_tokens: int
    prompt_tokens: int
    mean_running: float  # summed over the hosts, over the whole job
    prefill_busy_s: float  # summed over the hosts: their prefill batches, while nobody decoded

    @property
    def cached_share(self) -> float:
        return 1 - self.prefill_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def prefill_share(self) -> float:
        """The share of the hosts' time spent prefilling."""
        return self.prefill_busy_s / (self.hosts * self.wall_s) if self.wall_s else 0.0


def write_inputs(directory: Path, workload: Workload, seed: int = 0) -> tuple[Path, Path]:
    rng, words = random.Random(seed), _words()

    def text(count: int) -> str:
        return " ".join(rng.choices(words, k=count))

    sampled = directory / "sampled.jsonl"
    with open(sampled, "w") as out:
        for i in range(workload.prompts):
            out.write(json.dumps({"id": f"s{i}", "messages": [
                {"role": "user", "content": text(workload.prompt_words)}]}) + "\n")
    talks = directory / "talks.jsonl"
    with open(talks, "w") as out:
        for i in range(workload.conversations):
            messages = [{"role": "system", "content": text(workload.prompt_words)}]
            for _ in range(workload.turns):
                messages += [{"role": "user", "content": text(30)}, {"role": "assistant", "content": text(20)}]
            out.write(json.dumps({"id": f"t{i}", "messages": messages}) + "\n")
    return sampled, talks


def run_routing(workload: Workload, mode: str, hosts: int, inputs: tuple[Path, Path]) -> RoutingResult:
    sampled, talks = inputs
    with Processes(prefix=f"genfleet-bench-affinity-{mode}{hosts}-") as procs:
        _, redis_url = procs.start_redis()
        sims = [url for _, url in (procs.start_sim(f"sim{i}", workload.sim_flags()) for i in range(hosts))]
        env = env_for(redis_url, procs.dir / "output", routing=mode, tokenizer=TOKENIZER)
        worker = procs.start_worker("worker", env, sims)
        procs.wait_ready([worker])
        client = redis_client(redis_url)
        for url in sims:
            httpx.post(f"{url}/sim/stats/reset", timeout=5)
        started = time.monotonic()
        common = ("--tokenizer", str(TOKENIZER), "--max-new-tokens", "1024")
        runs = {"samples": procs.start("enqueue-samples", genfleet(
                    "enqueue", "--run", "samples", *common, "--samples", str(workload.samples),
                    "--temperature", "1", f"s={sampled}"), env),
                "turns": procs.start("enqueue-turns", genfleet(
                    "enqueue", "--run", "turns", *common, "--regenerate", "all", f"t={talks}"), env)}
        while (done := _done(client, runs)) < workload.prompts * workload.samples + workload.conversations:
            if time.monotonic() - started > RUN_TIMEOUT_S:
                raise TimeoutError(f"{mode} x{hosts}: {done} done after {RUN_TIMEOUT_S:.0f} s")
            for child in procs.children:
                if child.name.startswith("enqueue") and child.process.poll() not in (None, 0):
                    raise RuntimeError(f"{child.name} failed:\n{child.tail()}")
            if not worker.alive():
                raise RuntimeError(f"the worker exited:\n{worker.tail()}")
            time.sleep(POLL_S)
        wall = time.monotonic() - started
        stats = [httpx.get(f"{url}/sim/stats", timeout=5).json() for url in sims]
    return RoutingResult(mode=mode, hosts=hosts, wall_s=wall,
                         prefill_tokens=sum(s["prefill_tokens_computed"] for s in stats),
                         prompt_tokens=sum(s["prompt_tokens_total"] for s in stats),
                         mean_running=sum(s["mean_running"] for s in stats),
                         prefill_busy_s=sum(s["prefill_busy_s"] for s in stats))


def _done(client: redis.Redis, runs: dict) -> int:
    from genfleet.status.read_model import read_progress

    done = 0
    for run in runs:
        totals = read_progress(client, run).totals()
        if totals.failed:
            raise RuntimeError(f"run {run}: {totals.failed} prompts failed")
        done += totals.done
    return done


def compare(workload: Workload, workdir: Path, host_counts: tuple[int, ...] = (2, 4)) -> dict:
    inputs = write_inputs(workdir, workload)
    results = [run_routing(workload, mode, hosts, inputs) for hosts in host_counts for mode in MODES]
    by = {(r.mode, r.hosts): r for r in results}
    return {
        "workload": workload.describe(),
        "results": [{**asdict(r), "cached_share": r.cached_share, "prefill_share": r.prefill_share}
                    for r in results],
        "ratios": {hosts: _ratios(by["affinity", hosts], by["least-busy", hosts]) for hosts in host_counts},
    }


def _ratios(affinity: RoutingResult, least_busy: RoutingResult) -> dict[str, float]:
    return {"prefill_tokens": affinity.prefill_tokens / least_busy.prefill_tokens,
            "wall": affinity.wall_s / least_busy.wall_s}


def main() -> None:
    import tempfile

    from bench.processes import interrupt_on_signals

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--hosts", default="2,4")
    args = parser.parse_args()
    interrupt_on_signals()
    with tempfile.TemporaryDirectory(prefix="genfleet-bench-affinity-") as workdir:
        hosts = tuple(int(n) for n in args.hosts.split(","))
        print(json.dumps(compare(QUICK if args.quick else FULL, Path(workdir), hosts), indent=1))


if __name__ == "__main__":
    main()
