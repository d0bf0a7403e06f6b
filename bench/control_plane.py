"""Control-plane cost, measured: what Redis, Flower and a worker spend per finished prompt when the
GPU is not the limit. `bench/control_model.py` turns it into ceilings and a plan for 10,000,000
prompts on 100 hosts in a day; `bench/redis_meter.py` does the measuring.

    .venv/bin/python -m bench.control_plane [--quick] [--no-flower] [--sims 1] [--json out.json]

Each part starts its own throwaway redis-server:
- queue: Redis alone, idle (its own cron's CPU), then `genfleet enqueue` with no worker at two prompt
  sizes: used_memory per queued prompt (fitted as a + b·tokens), commands and CPU per enqueued prompt;
  then one lease heartbeat and one reaper pass over K messages held past the lease TTL, with the
  workers' own code: what a fleet of minutes-long tasks holds at any time, which these runs' 0.1-s
  tasks never do;
- fleet, at N and 4N prompts: fast simulators, one short worker, Flower. A warm-up run first (a fleet
  is long-lived: the worker's threads and Redis connections are open), an idle window (the cost per
  second of a worker and Flower doing nothing), then from `genfleet enqueue` to the last prompt done
  and settled (nothing unacked, no lease left): commands, Redis CPU, Celery events, worker and Flower
  CPU, and the memory the run leaves behind.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import redis

from bench import control_model
from bench.proc_stats import peak_rss_bytes, wait_with_usage
from bench.processes import TOKENIZER, Child, Processes, env_for, free_port, genfleet, redis_client, wait_for
from bench.prompts import write_prompts
from bench.redis_meter import EventCounter, Meter, delta

FLOWER_AUTH = ("bench", "bench")
SETTLE_TIMEOUT_S = 45.0  # a finished task's lease goes at its worker's next lease heartbeat (15 s)
RUN_TIMEOUT_S = 600.0
LARGE_REPEAT = 15  # a large prompt: a small prompt's text 15 times (~400-600 tokens)
WARM_PROMPTS = 300  # twice the worker's 150 threads: each has run a task and holds its connection


@dataclass(frozen=True)
class Workload:
    prompts: int  # the first fleet run; the second has 4x
    sims: int = 1
    flower: bool = True
    idle_s: float = 10.0
    held: int = 12_000  # messages held in the background part: ~ what the target fleet holds past the TTL
    # Fast hosts: 20-60 tokens a request at up to 5,000 tok/s, so the control plane is the limit.
    sim_flags: tuple[str, ...] = ("--rate", "5000", "--length-tokens", "20:60")
    max_new_tokens: int = 100

    def describe(self) -> str:
        return (f"{self.prompts:,} and {4 * self.prompts:,} prompts; {self.sims} × `genfleet sim "
                f"{' '.join(self.sim_flags)}`, one `genfleet worker --pool short`"
                + (", `genfleet flower`" if self.flower else ", no Flower"))


FULL = Workload(prompts=3_000)
QUICK = replace(FULL, prompts=300, idle_s=4.0, held=2_000)


def queue_cost(w: Workload, workdir: Path) -> dict:
    small = write_prompts(workdir / "small.jsonl", w.prompts, prefix="s")
    large = workdir / "large.jsonl"
    with open(small) as rows, open(large, "w") as out:
        for line in rows:
            row = json.loads(line)
            row["id"], text = "l" + row["id"][1:], row["messages"][0]["content"]
            row["messages"][0]["content"] = " ".join([text] * LARGE_REPEAT)
            out.write(json.dumps(row) + "\n")
    with Processes(prefix="genfleet-bench-queue-") as procs:
        _, url = procs.start_redis()
        meter = Meter(redis_client(url))
        before = meter.snapshot()
        time.sleep(w.idle_s)
        env, points = env_for(url, procs.dir / "output"), {"redis_idle": delta(before, meter.snapshot())}
        for run, path in (("small", small), ("large", large)):
            memory = meter.settled_memory()["total.allocated"]  # before the snapshot: it resets commandstats
            before = meter.snapshot()
            producer_cpu = _enqueue(procs, env, run, path, w.max_new_tokens)
            points[run] = {**delta(before, meter.snapshot()), "producer_cpu_s": producer_cpu,
                           "bytes_per_prompt": (meter.settled_memory()["total.allocated"] - memory) / w.prompts}
        for run in ("small", "large"):  # read last: a whole-queue LRANGE leaves reply buffers behind
            points[run].update(_queued(meter.client, run))
        s, lg = points["small"], points["large"]
        tokens = lg["prompt_tokens"] - s["prompt_tokens"]
        slope = (lg["bytes_per_prompt"] - s["bytes_per_prompt"]) / tokens
        fit = {"a": s["bytes_per_prompt"] - slope * s["prompt_tokens"], "b": slope,
               "wire_a": s["message_bytes"] - s["prompt_tokens"] * (lg["message_bytes"] - s["message_bytes"]) / tokens,
               "wire_b": (lg["message_bytes"] - s["message_bytes"]) / tokens}
        return {"prompts": w.prompts, "points": points, "fit": fit, "background": background_cost(meter, w.held)}


def _enqueue(procs: Processes, env: dict[str, str], run: str, prompts: Path, max_new_tokens: int) -> float:
    """`genfleet enqueue` of one dataset named like its run; the producer's CPU seconds."""
    child = procs.start(f"enqueue-{run}", genfleet("enqueue", "--run", run, "--tokenizer", str(TOKENIZER),
                                                   "--max-new-tokens", str(max_new_tokens), f"{run}={prompts}"), env)
    exit_ = wait_with_usage(child.process, timeout=RUN_TIMEOUT_S)
    if exit_.returncode != 0:
        raise RuntimeError(f"genfleet enqueue failed:\n{child.tail()}")
    procs.stop(child)  # reaped already: this only drops it from the children watched
    return exit_.cpu_s


def _queued(client: redis.Redis, run: str) -> dict:
    """Mean wire bytes and prompt tokens of `run`'s messages in the short queue."""
    from genfleet.common.kombu_wire import decode_queued, task_payload

    sizes, tokens = [], []
    for raw in client.lrange("short", 0, -1):
        payload = task_payload(decode_queued(raw)) or {}
        if payload.get("run") == run:
            sizes.append(len(raw))
            tokens.append(payload.get("prompt_tokens", 0))
    return {"messages": len(sizes), "message_bytes": sum(sizes) / max(len(sizes), 1),
            "prompt_tokens": sum(tokens) / max(len(tokens), 1)}


def background_cost(meter: Meter, held: int) -> dict:
    """One lease heartbeat and one reaper pass (workers/delivery.py, as they are) with `held` messages
    in hand, all fetched longer than the lease TTL ago and each under a live lease; and, to compare,
    the reaper's lease reads done as one ZMSCORE."""
    from genfleet.common.keys import KOMBU_UNACKED, KOMBU_UNACKED_INDEX, LEASES
    from genfleet.workers.delivery import LeaseKeeper, Reaper

    tags = [f"bench-{i:06d}" for i in range(held)]
    meter.client.zadd(KOMBU_UNACKED_INDEX, dict.fromkeys(tags, time.time() - 600))
    meter.client.hset(KOMBU_UNACKED, mapping=dict.fromkeys(tags, "held"))
    keeper = LeaseKeeper(meter.client, ttl_s=60.0, heartbeat_s=15.0)
    for tag in tags:
        keeper.hold(tag)
    start = meter.snapshot()
    keeper.renew()
    renewed = meter.snapshot()
    Reaper(meter.client, ttl_s=60.0, interval_s=10.0).reap_once()
    reaped = meter.snapshot()
    meter.client.execute_command("ZMSCORE", LEASES, *tags)
    return {"held": held, "renew": delta(start, renewed), "reap": delta(renewed, reaped),
            "zmscore": delta(reaped, meter.snapshot())}


@dataclass
class Fleet:
    url: str
    env: dict[str, str]
    sims: list[str]
    pids: dict[str, int]
    clients: list[Child]  # the worker and Flower
    empty_memory: dict  # MEMORY STATS of the fresh Redis, before any client
    flower_url: str | None = None


def fleet_run(w: Workload, prompts: int, workdir: Path) -> dict:
    path = write_prompts(workdir / f"fleet{prompts}.jsonl", prompts)
    warm = write_prompts(workdir / "warm.jsonl", WARM_PROMPTS, seed=1, prefix="w")
    with Processes(prefix="genfleet-bench-control-") as procs:
        fleet = _start_fleet(w, procs)
        meter = Meter(redis_client(fleet.url), fleet.pids)
        events = EventCounter(redis_client(fleet.url))
        events.start()
        _enqueue(procs, fleet.env, "warm", warm, w.max_new_tokens)
        _wait_done(meter, procs, "warm", WARM_PROMPTS)
        _settle(meter)
        keys_before = meter.key_memory()
        idle0, idle_events0 = meter.snapshot(), events.read()
        time.sleep(w.idle_s)
        start, start_events = meter.snapshot(), events.read()
        http = httpx.Client(timeout=5.0)
        for sim_url in fleet.sims:  # job-level occupancy: reset at enqueue, read at the last completion
            http.post(f"{sim_url}/sim/stats/reset").raise_for_status()
        producer_cpu = _enqueue(procs, fleet.env, "bench", path, w.max_new_tokens)
        _wait_done(meter, procs, "bench", prompts)
        job_s = time.monotonic() - start.at
        mean_running = sum(http.get(f"{sim_url}/sim/stats").json()["mean_running"] for sim_url in fleet.sims)
        http.close()
        settle_s = _settle(meter)
        end, end_events = meter.snapshot(), events.read()
        flower = _flower_state(fleet.flower_url, fleet.pids)
        # What stays once the fleet is gone: used_memory with no client connected but this bench's
        # own, so that no connection's buffers (which float by tens of KB) are counted.
        events.stop()
        for child in fleet.clients:
            procs.stop(child)
        time.sleep(1.0)
        left = {name: value - fleet.empty_memory.get(name, 0) for name, value in meter.settled_memory().items()
                if not name.startswith(("allocator", "rss", "fragmentation", "peak"))}
        return {"prompts": prompts, "job_s": job_s, "settle_s": settle_s, "producer_cpu_s": producer_cpu,
                "job_mean_running": mean_running, "slots": 150 * w.sims,
                "idle": {**delta(idle0, start), **_event_delta(idle_events0, start_events)},
                "run": {**delta(start, end), **_event_delta(start_events, end_events)},
                "left_memory": left, "flower": flower, "keys_before": keys_before, "keys_after": meter.key_memory()}


def _start_fleet(w: Workload, procs: Processes) -> Fleet:
    """Redis, the simulators, Flower (before the worker: it sees every event) and one short worker."""
    _, url = procs.start_redis()
    empty = Meter(redis_client(url)).settled_memory()
    sims = [procs.start_sim(f"sim{i}", list(w.sim_flags)) for i in range(w.sims)]
    fleet = Fleet(url, env_for(url, procs.dir / "output"), [sim_url for _, sim_url in sims], {}, [], empty)
    if w.flower:
        port = free_port()
        flower = procs.start("flower", genfleet("flower", "--port", str(port)),
                             {**fleet.env, "GENFLEET_FLOWER_AUTH": ":".join(FLOWER_AUTH)})
        fleet.flower_url = f"http://127.0.0.1:{port}"
        wait_for(lambda: httpx.get(f"{fleet.flower_url}/healthcheck", auth=FLOWER_AUTH, timeout=1).status_code
                 == 200, "flower", flower)
        fleet.pids["flower"] = flower.pid
        fleet.clients.append(flower)
    worker = procs.start_worker("worker", fleet.env, fleet.sims)
    procs.wait_ready([worker])
    fleet.clients.insert(0, worker)
    fleet.pids.update({"worker": worker.pid, **{child.name: child.pid for child, _ in sims}})
    return fleet


def _flower_state(url: str | None, pids: dict[str, int]) -> dict | None:
    """The task events Flower handled since it started, by type (its Prometheus counter: did it keep
    up?), and its peak RSS. Its counter leaves out the producer's `task-sent` (Flower does record the
    task: /api/tasks lists it PENDING)."""
    if url is None:
        return None
    seen: Counter = Counter()
    for line in httpx.get(f"{url}/metrics", auth=FLOWER_AUTH, timeout=10).text.splitlines():
        if line.startswith("flower_events_total{") and (kind := re.search(r'type="([^"]+)"', line)):
            seen[kind.group(1)] += float(line.rsplit(" ", 1)[1])
    return {"events_seen": dict(seen), "peak_rss_bytes": peak_rss_bytes(pids["flower"])}


def _event_delta(a: tuple, b: tuple) -> dict:
    return {"event_messages": dict(b[0] - a[0]), "events": dict(b[1] - a[1]), "event_bytes": dict(b[2] - a[2])}


def _wait_done(meter: Meter, procs: Processes, run: str, prompts: int) -> None:
    from genfleet.common.keys import RunKeys

    counters, deadline = RunKeys(run).counters(run), time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        done, failed = (int(v or 0) for v in meter.poll(("HMGET", counters, "done", "failed"))[0])
        if failed:
            raise RuntimeError(f"{failed} prompts of {run} failed")
        if done >= prompts:
            return
        procs.check_alive()
        time.sleep(0.1)
    raise TimeoutError(f"{run} not done after {RUN_TIMEOUT_S:.0f} s")


def _settle(meter: Meter) -> float:
    """Until nothing is unacked and the worker's heartbeat has dropped every lease: what stays is the
    state the run leaves behind, not a task's in-flight bookkeeping."""
    from genfleet.common.keys import KOMBU_UNACKED, LEASES

    started = time.monotonic()
    while time.monotonic() - started < SETTLE_TIMEOUT_S:
        if meter.poll(("ZCARD", LEASES), ("HLEN", KOMBU_UNACKED)) == [0, 0]:
            break
        time.sleep(0.25)
    return time.monotonic() - started


def measure(w: Workload) -> dict:
    with tempfile.TemporaryDirectory(prefix="genfleet-bench-control-") as tmp:
        queue = queue_cost(w, Path(tmp))
        runs = [fleet_run(w, n, Path(tmp)) for n in (w.prompts, 4 * w.prompts)]
    return {"workload": w.describe(), "queue": queue, "runs": runs}


def main() -> None:
    from bench.processes import interrupt_on_signals

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="300 and 1,200 prompts: checks the harness")
    parser.add_argument("--no-flower", action="store_true")
    parser.add_argument("--sims", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write every measured figure here")
    args = parser.parse_args()
    interrupt_on_signals()
    workload = replace(QUICK if args.quick else FULL, flower=not args.no_flower, sims=args.sims)
    print(workload.describe(), file=sys.stderr, flush=True)
    started = time.monotonic()
    result = {**measure(workload), "elapsed_s": time.monotonic() - started}
    if args.json:  # the raw figures first: `python -m bench.control_model` re-derives the model from them
        args.json.parent.mkdir(parents=True, exist_ok=True)  # bench/results/ is not in the clone (ignored)
        args.json.write_text(json.dumps(result, indent=1, default=str))
    result["model"] = control_model.summarise(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    print(control_model.render(result["model"]))


if __name__ == "__main__":
    main()
