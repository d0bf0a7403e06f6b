"""Scaling with hosts: 1, 2 and 4 simulated hosts, each its own simulator with the same capacity and
its own short worker (`--upstream` of that host), all fed by one producer through one Redis.

    .venv/bin/python -m bench.scaling [--quick] [--hosts 1,2,4]

Throughput is the simulators' generated tokens per second in the steady state: from the first
10% of completions until the queue runs dry (or 90%, whichever comes first), while every host
could be busy. The drain after that is the same for any host count: it counts only in the whole
job's mean running count (from enqueue to the last completion), which is waited for.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, replace

import redis

from bench.proc_stats import MachineCpu, cpu_seconds
from bench.processes import TOKENIZER, Processes, env_for, genfleet, redis_client
from bench.prompts import write_prompts
from bench.steady_state import JobWindow, Window
from genfleet.status.read_model import read_progress

SLOTS = 150  # in flight per host
POLL_S = 0.05
RUN_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class HostProfile:
    """One simulated host, capacity-bound rather than CPU-bound on 2 cores: few tokens per second
    per host (interval 32 makes a token cheap for the worker), so that 4 hosts, 4 workers,
    Redis and the producer fit in the CPU."""

    prompts_per_host: int
    rate: float
    knee: float
    length_median: float
    length_mean: float
    max_new_tokens: int

    def sim_flags(self) -> list[str]:
        return ["--rate", str(self.rate), "--knee", str(self.knee), "--length-median", str(self.length_median),
                "--length-mean", str(self.length_mean)]

    @property
    def capacity_tok_s(self) -> float:
        """What a host generates with all 150 slots busy."""
        return SLOTS * self.rate / (1 + SLOTS / self.knee)

    def describe(self) -> str:
        return (f"{self.prompts_per_host:,} prompts per host; `genfleet sim --rate {self.rate:g} --knee {self.knee:g} "
                f"--length-median {self.length_median:g} --length-mean {self.length_mean:g}` "
                f"({self.capacity_tok_s:,.0f} tok/s per host at {SLOTS} running); max_new_tokens {self.max_new_tokens}")


FULL = HostProfile(prompts_per_host=500, rate=30.0, knee=64.0, length_median=60.0, length_mean=70.0,
                   max_new_tokens=300)
QUICK = replace(FULL, prompts_per_host=250, rate=60.0, length_median=30.0, length_mean=35.0, max_new_tokens=150)


@dataclass(frozen=True)
class HostsResult:
    hosts: int
    window: Window
    setup_s: float  # starting the sims and workers, not measured
    # CPU cores in use during the window: the fleet's own processes, and the whole machine.
    sim_cores: float
    worker_cores: float
    redis_cores: float
    machine_busy_cores: float
    job_mean_running: float = 0.0  # summed over hosts, from enqueue to the last completion (the drain too)

    @property
    def own_cores(self) -> float:
        return self.sim_cores + self.worker_cores + self.redis_cores

    @property
    def tokens_per_s(self) -> float:
        return self.window.tokens_per_s

    @property
    def occupancy(self) -> float:
        return self.window.occupancy(SLOTS * self.hosts)

    @property
    def job_occupancy(self) -> float:
        return self.job_mean_running / (SLOTS * self.hosts)

    def to_dict(self) -> dict:
        return {**asdict(self), "tokens_per_s": self.tokens_per_s, "occupancy": self.occupancy,
                "job_occupancy": self.job_occupancy, "own_cores": self.own_cores}


def run_hosts(profile: HostProfile, hosts: int) -> HostsResult:
    total = profile.prompts_per_host * hosts
    # Close the window while the queue still holds prompts: after completion total - slots, no new
    # request starts and occupancy falls whatever the fleet does.
    closes_at = min(0.9, (total - SLOTS * hosts) / total)
    with Processes(prefix=f"genfleet-bench-scaling{hosts}-") as procs:
        setup_started = time.monotonic()
        redis_child, redis_url = procs.start_redis()
        # The run is cut off with 150 streams per worker in flight: no grace for them at the end.
        env = env_for(redis_url, procs.dir / "output", shutdown_grace_s=0.5)
        sims = [procs.start_sim(f"sim{i}", profile.sim_flags()) for i in range(hosts)]
        workers = [procs.start_worker(f"worker{i}", env, [url]) for i, (_, url) in enumerate(sims)]
        procs.wait_ready(workers)
        prompts = write_prompts(procs.dir / "prompts.jsonl", total)
        window = JobWindow([url for _, url in sims], total, closes_at=closes_at)
        window.reset()
        setup_s = time.monotonic() - setup_started
        started = time.monotonic()
        enqueue = procs.start("enqueue", genfleet("enqueue", "--run", "bench", "--tokenizer", str(TOKENIZER),
                                                  "--max-new-tokens", str(profile.max_new_tokens),
                                                  f"bench={prompts}"), env)
        groups = {"sim": [sim.pid for sim, _ in sims], "worker": [w.pid for w in workers],
                  "redis": [redis_child.pid]}
        cpu_at_open: dict[str, float] = {}
        machine = None
        try:
            while window.window is None:
                window.poll()
                if window.opened and machine is None:
                    machine, cpu_at_open = MachineCpu(), _cpu_by_group(groups)
                procs.check_alive(ignore=enqueue)
                if enqueue.process.poll() not in (None, 0):
                    raise RuntimeError(f"genfleet enqueue failed:\n{enqueue.tail()}")
                if time.monotonic() - started > RUN_TIMEOUT_S:
                    raise TimeoutError(f"{hosts} hosts: steady state not over after {RUN_TIMEOUT_S:.0f} s")
                time.sleep(POLL_S)
            busy = machine.busy_cores()
            used = {name: (cpu - cpu_at_open[name]) / window.window.seconds
                    for name, cpu in _cpu_by_group(groups).items()}
            # The drain, for the whole job's mean running only: counted in Redis, not by the hosts,
            # whose counters miss what finishes between a stats read and the window's reset.
            client = redis_client(redis_url)
            while _settled(client) < total:
                procs.check_alive(ignore=enqueue)
                if time.monotonic() - started > RUN_TIMEOUT_S:
                    raise TimeoutError(f"{hosts} hosts: not drained after {RUN_TIMEOUT_S:.0f} s")
                time.sleep(POLL_S)
            job_running = window.job_mean_running()
        finally:
            window.close()
        return HostsResult(hosts=hosts, window=window.window, setup_s=setup_s, sim_cores=used["sim"],
                           worker_cores=used["worker"], redis_cores=used["redis"], machine_busy_cores=busy,
                           job_mean_running=job_running)


def _settled(client: redis.Redis) -> int:
    totals = read_progress(client, "bench").totals()
    return totals.done + totals.failed


def _cpu_by_group(groups: dict[str, list[int]]) -> dict[str, float]:
    return {name: sum(cpu_seconds(pid) for pid in pids) for name, pids in groups.items()}


@dataclass(frozen=True)
class Scaling:
    profile: HostProfile
    results: list[HostsResult]

    def relative(self, hosts: int) -> float:
        """Throughput with `hosts` hosts over throughput with one."""
        by_hosts = {r.hosts: r for r in self.results}
        return by_hosts[hosts].tokens_per_s / by_hosts[1].tokens_per_s

    def to_dict(self) -> dict:
        return {"profile": asdict(self.profile), "results": [r.to_dict() for r in self.results],
                "relative": {r.hosts: self.relative(r.hosts) for r in self.results}}


def measure(profile: HostProfile, host_counts: tuple[int, ...] = (1, 2, 4)) -> Scaling:
    return Scaling(profile, [run_hosts(profile, hosts) for hosts in host_counts])


def main() -> None:
    from bench.processes import interrupt_on_signals

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--hosts", default="1,2,4")
    args = parser.parse_args()
    interrupt_on_signals()
    profile = QUICK if args.quick else FULL
    print(profile.describe(), flush=True)
    counts = tuple(int(n) for n in args.hosts.split(","))
    print(json.dumps(measure(profile, counts).to_dict(), indent=1, default=str))


if __name__ == "__main__":
    main()
