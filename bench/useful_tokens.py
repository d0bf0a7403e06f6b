"""GPU tokens per useful token: the loop guard and truncation continuation against the naive policy.

    .venv/bin/python -m bench.useful_tokens [--quick]

One workload, run twice on a fresh simulator each: completions with the seeds' length shape (scaled
down), a share of them over the short cap, and 10% degenerate loops that repeat until their cap.

- naive: `--loop-guard off --on-truncated regenerate`: a loop runs to the short cap, is cut, is
  asked again on long and loops to the long cap; an over-cap completion is generated to the short
  cap, thrown away and generated again from scratch.
- genfleet: `--loop-guard abort --on-truncated continue`: a loop is stopped soon after it starts
  and its slot freed (`/abort_request`); an over-cap completion goes on from where it was cut.

The simulator counts every token it decodes (`tokens_generated` in `/sim/stats`), aborted ones
included: that is the GPU time. Useful output is the completions that finished on their own (stop
token, not a loop): both policies must produce the same ones, token for token.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import redis

from bench.processes import TOKENIZER, Processes, env_for, genfleet, redis_client
from bench.prompts import write_prompts
from genfleet.common.shards import ShardReader, find_shards

POLL_S = 0.1
RUN_TIMEOUT_S = 900.0
POLICIES = {"naive": ("--loop-guard", "off", "--on-truncated", "regenerate"),
            "genfleet": ("--loop-guard", "abort", "--on-truncated", "continue")}


@dataclass(frozen=True)
class Workload:
    prompts: int
    length_scale: float  # of the seeds' lognormal (median 646, mean 1,416 tokens)
    short_cap: int
    long_cap: int
    loop_rate: float = 0.1
    rate: float = 2000.0

    def sim_flags(self) -> list[str]:
        return ["--rate", str(self.rate), "--knee", "64", "--length-scale", str(self.length_scale),
                "--loop-rate", str(self.loop_rate), "--stream-interval", "16"]

    def describe(self) -> str:
        return (f"{self.prompts:,} prompts, lengths median {646 * self.length_scale:.0f} / mean "
                f"{1416 * self.length_scale:.0f} tokens, {self.loop_rate:.0%} loops (period 5-40 from token "
                f"16-400), max_new_tokens {self.short_cap:,} short / {self.long_cap:,} long")


FULL = Workload(prompts=1000, length_scale=0.5, short_cap=1024, long_cap=4096)
QUICK = Workload(prompts=120, length_scale=0.25, short_cap=256, long_cap=1024)


@dataclass(frozen=True)
class PolicyResult:
    policy: str
    wall_s: float
    gpu_tokens: int  # every token the server decoded
    useful_tokens: int  # completion tokens of records that finished on their own
    useful: int
    looped: int
    truncated: int
    aborted_requests: int

    @property
    def gpu_per_useful(self) -> float:
        return self.gpu_tokens / self.useful_tokens if self.useful_tokens else float("inf")


def run_policy(workload: Workload, policy: str, workdir: Path) -> tuple[PolicyResult, dict[str, list[int]]]:
    prompts = write_prompts(workdir / "prompts.jsonl", workload.prompts, prefix="u")
    with Processes(prefix=f"genfleet-bench-useful-{policy}-") as procs:
        _, redis_url = procs.start_redis()
        _, sim_url = procs.start_sim("sim", workload.sim_flags())
        env = env_for(redis_url, procs.dir / "output", stream_interval=16)
        workers = [procs.start_worker(f"worker-{pool}", env, [sim_url], pool=pool) for pool in ("short", "long")]
        procs.wait_ready(workers)
        client = redis_client(redis_url)
        started = time.monotonic()
        enqueue = procs.start("enqueue", genfleet(
            "enqueue", "--run", "bench", "--tokenizer", str(TOKENIZER), "--keep-token-ids",
            "--max-new-tokens-short", str(workload.short_cap), "--max-new-tokens-long", str(workload.long_cap),
            *POLICIES[policy], f"u={prompts}"), env)
        while (done := _done(client)) < workload.prompts:
            if time.monotonic() - started > RUN_TIMEOUT_S:
                raise TimeoutError(f"{policy}: {done} of {workload.prompts} done after {RUN_TIMEOUT_S:.0f} s")
            procs.check_alive(ignore=enqueue)
            time.sleep(POLL_S)
        wall = time.monotonic() - started
        stats = httpx.get(f"{sim_url}/sim/stats", timeout=5).json()
        # Every record once (a record written twice by a crash before its ack is one completion).
        records = {line.record["id"]: line.record
                   for line in ShardReader(find_shards([procs.dir / "output"], "bench"), "bench")}
    finishes = [r["finish_reason"] for r in records.values()]
    useful = {rid: r["output_ids"] for rid, r in records.items() if r["finish_reason"] == "stop"}
    result = PolicyResult(
        policy=policy, wall_s=wall, gpu_tokens=stats["tokens_generated"],
        useful_tokens=sum(len(ids) for ids in useful.values()), useful=len(useful),
        looped=finishes.count("loop"), truncated=finishes.count("length"),
        aborted_requests=stats.get("aborted_requests", 0))
    return result, useful


def _done(client: redis.Redis) -> int:
    from genfleet.status.read_model import read_progress

    totals = read_progress(client, "bench").totals()
    return totals.done + totals.failed


def compare(workload: Workload, workdir: Path) -> dict:
    results, useful = {}, {}
    for policy in POLICIES:
        (workdir / policy).mkdir(parents=True, exist_ok=True)
        results[policy], useful[policy] = run_policy(workload, policy, workdir / policy)
    naive, ours = results["naive"], results["genfleet"]
    return {
        "workload": workload.describe(),
        "results": {name: {**asdict(r), "gpu_per_useful": r.gpu_per_useful} for name, r in results.items()},
        # Same useful output: the same completions finished on their own, token for token.
        "same_useful_output": useful["naive"] == useful["genfleet"],
        "gpu_tokens_ratio": ours.gpu_tokens / naive.gpu_tokens,
        "wall_ratio": ours.wall_s / naive.wall_s,
    }


def main() -> None:
    import tempfile

    from bench.processes import interrupt_on_signals

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    interrupt_on_signals()
    workload = QUICK if args.quick else FULL
    with tempfile.TemporaryDirectory(prefix="genfleet-bench-useful-") as workdir:
        print(json.dumps(compare(workload, Path(workdir)), indent=1))


if __name__ == "__main__":
    main()
