"""Throughput on one simulated host: the same prompts through genfleet (producer, one short worker,
Redis) and through the baseline script, each on a fresh simulator with the same capacity.

    .venv/bin/python -m bench.throughput [--quick] [--prompts N]

Per side: completion tokens over the wall time, the simulator's steady-state occupancy, the
client's CPU per generated token (the worker process; the baseline process), peak memory.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TypeVar

import redis

from bench.proc_stats import MachineCpu, cpu_seconds, has_exited, peak_rss_bytes, wait_with_usage
from bench.processes import REPO, TOKENIZER, Processes, env_for, genfleet, redis_client
from bench.prompts import write_prompts
from bench.steady_state import JobWindow, Window

T = TypeVar("T")

SLOTS = 150  # in flight per host (docs/ARCHITECTURE.md), for genfleet and the baseline's semaphore
POLL_S = 0.05
RUN_TIMEOUT_S = 600.0
BASELINE_SCRIPT = REPO / "bench" / "baseline_client.py"


@dataclass(frozen=True)
class Profile:
    """The simulated GPU and the workload.

    At 150 running, each request decodes at rate / (1 + 150 / knee) tok/s. Completion lengths are
    the simulator's own lognormal (median 646 / mean 1,416 words, the seeds' reasoning outputs)
    times `length_scale`, cut at `max_new_tokens` so that one straggler does not set the wall time.
    """

    prompts: int
    rate: float
    knee: float
    length_scale: float
    max_new_tokens: int

    def sim_flags(self) -> list[str]:
        return ["--rate", str(self.rate), "--knee", str(self.knee), "--length-scale", str(self.length_scale)]

    @property
    def per_request_tok_s(self) -> float:
        return self.rate / (1 + SLOTS / self.knee)

    def describe(self) -> str:
        return (f"{self.prompts:,} prompts; `genfleet sim --rate {self.rate:g} --knee {self.knee:g} "
                f"--length-scale {self.length_scale:g}` (at {SLOTS} running {self.per_request_tok_s:.0f} tok/s "
                f"per request, {SLOTS * self.per_request_tok_s:,.0f} tok/s in all); max_new_tokens "
                f"{self.max_new_tokens:,}")


# ~45 s a side on 2 cores; the simulated server's capacity is genfleet's limit.
FULL = Profile(prompts=2000, rate=350.0, knee=64.0, length_scale=0.3, max_new_tokens=2048)
QUICK = replace(FULL, prompts=300, rate=600.0, length_scale=0.05, max_new_tokens=200)


@dataclass(frozen=True)
class SideResult:
    """One client's run: genfleet's or the baseline's."""

    wall_s: float
    prompts: int
    completion_tokens: int
    window: Window | None
    client_cpu_s: float  # the worker process, or the baseline process
    client_peak_rss_bytes: int
    sim_cpu_s: float
    sim_peak_running: int
    machine_busy_cores: float  # all CPUs during the run: ours and anyone else's
    other_cpu_s: float = 0.0  # genfleet only: producer + redis-server
    job_mean_running: float = 0.0  # over the whole job: from enqueue (the script's start) to the last completion

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.wall_s

    @property
    def cpu_us_per_token(self) -> float:
        return 1e6 * self.client_cpu_s / max(self.completion_tokens, 1)

    @property
    def occupancy(self) -> float | None:
        return self.window.occupancy(SLOTS) if self.window else None

    @property
    def job_occupancy(self) -> float:
        return self.job_mean_running / SLOTS

    @property
    def own_cores(self) -> float:
        """CPU cores the run's own processes (client, simulator, Redis, producer) kept busy."""
        return (self.client_cpu_s + self.sim_cpu_s + self.other_cpu_s) / self.wall_s

    def to_dict(self) -> dict:
        return {**asdict(self), "tokens_per_s": self.tokens_per_s, "cpu_us_per_token": self.cpu_us_per_token,
                "occupancy": self.occupancy, "job_occupancy": self.job_occupancy, "own_cores": self.own_cores}


def run_genfleet(profile: Profile, prompts: Path, py_spy: Path | None = None) -> SideResult:
    """Worker up and idle first (a fleet is long-lived), then the clock runs from `genfleet enqueue`
    to the last record durable and counted in Redis. `py_spy`: record the worker's stacks (collapsed
    format) into this file with py-spy, which must be on PATH."""
    with Processes(prefix="genfleet-bench-fleet-") as procs:
        redis_child, redis_url = procs.start_redis()
        sim, sim_url = procs.start_sim("sim", profile.sim_flags())
        env = env_for(redis_url, procs.dir / "output")
        worker = procs.start_worker("worker", env, [sim_url])
        procs.wait_ready([worker])
        client = redis_client(redis_url)
        window = JobWindow([sim_url], profile.prompts)
        window.reset()
        worker_cpu, sim_cpu, redis_cpu = cpu_seconds(worker.pid), cpu_seconds(sim.pid), cpu_seconds(redis_child.pid)
        if py_spy is not None:
            spy = procs.start("py-spy", ["py-spy", "record", "--pid", str(worker.pid), "--format", "raw",
                                         "--rate", "200", "--gil", "--nonblocking", "--output", str(py_spy)])
            time.sleep(1.0)  # attached before the first task
        machine = MachineCpu()
        started = time.monotonic()
        enqueue = procs.start("enqueue", genfleet("enqueue", "--run", "bench", "--tokenizer", str(TOKENIZER),
                                                  "--max-new-tokens", str(profile.max_new_tokens),
                                                  f"bench={prompts}"), env)
        enqueue_exit = None
        progress = None
        next_progress = 0.0
        while True:
            window.poll()
            if enqueue_exit is None and has_exited(enqueue.process):
                enqueue_exit = wait_with_usage(enqueue.process)
                if enqueue_exit.returncode != 0:
                    raise RuntimeError(f"genfleet enqueue failed:\n{enqueue.tail()}")
            if time.monotonic() >= next_progress:
                progress = _progress(client)
                if progress["done"] + progress["failed"] >= profile.prompts:
                    break
                next_progress = time.monotonic() + 0.1
            if time.monotonic() - started > RUN_TIMEOUT_S:
                raise TimeoutError(f"genfleet run not finished after {RUN_TIMEOUT_S:.0f} s: {progress}")
            procs.check_alive(ignore=enqueue)
            time.sleep(POLL_S)
        wall = time.monotonic() - started
        window.poll(ended=True)
        job_running = window.job_mean_running()
        busy = machine.busy_cores()
        worker_cpu = cpu_seconds(worker.pid) - worker_cpu
        sim_cpu = cpu_seconds(sim.pid) - sim_cpu
        redis_cpu = cpu_seconds(redis_child.pid) - redis_cpu
        peak_rss = peak_rss_bytes(worker.pid)
        window.close()
        if py_spy is not None:
            procs.stop(spy, sig=signal.SIGINT)  # py-spy writes its file on SIGINT
        if progress["failed"]:
            raise RuntimeError(f"{progress['failed']} prompts failed; see {worker.log}")
        if enqueue_exit is None:
            enqueue_exit = wait_with_usage(enqueue.process, timeout=30)
        return SideResult(wall_s=wall, prompts=progress["done"], completion_tokens=progress["completion_tokens"],
                          window=window.window, client_cpu_s=worker_cpu, client_peak_rss_bytes=peak_rss,
                          sim_cpu_s=sim_cpu, sim_peak_running=_peak(window), machine_busy_cores=busy,
                          other_cpu_s=enqueue_exit.cpu_s + redis_cpu, job_mean_running=job_running)


def run_baseline(profile: Profile, prompts: Path) -> SideResult:
    """The clock runs from the script's start (imports, templating) to its exit (JSONL written)."""
    with Processes(prefix="genfleet-bench-baseline-") as procs:
        sim, sim_url = procs.start_sim("sim", profile.sim_flags())
        out = procs.dir / "baseline.jsonl"
        window = JobWindow([sim_url], profile.prompts)
        window.reset()
        sim_cpu = cpu_seconds(sim.pid)
        machine = MachineCpu()
        started = time.monotonic()
        client = procs.start("baseline", [sys.executable, str(BASELINE_SCRIPT), "--url", sim_url, "--tokenizer",
                                           str(TOKENIZER), "--prompts", str(prompts), "--out", str(out),
                                           "--concurrency", str(SLOTS),
                                           "--max-new-tokens", str(profile.max_new_tokens)])
        while not has_exited(client.process):
            window.poll()
            if time.monotonic() - started > RUN_TIMEOUT_S:
                raise TimeoutError(f"baseline not finished after {RUN_TIMEOUT_S:.0f} s:\n{client.tail()}")
            if not sim.alive():
                raise RuntimeError(f"sim exited:\n{sim.tail()}")
            time.sleep(POLL_S)
        exit_ = wait_with_usage(client.process)
        wall = time.monotonic() - started
        window.poll(ended=True)
        job_running = window.job_mean_running()
        busy = machine.busy_cores()
        sim_cpu = cpu_seconds(sim.pid) - sim_cpu
        window.close()
        if exit_.returncode != 0:
            raise RuntimeError(f"baseline failed ({exit_.returncode}):\n{client.tail()}")
        records = [json.loads(line) for line in out.read_text().splitlines() if line]
        return SideResult(wall_s=wall, prompts=len(records),
                          completion_tokens=sum(r["completion_tokens"] for r in records),
                          window=window.window, client_cpu_s=exit_.cpu_s,
                          client_peak_rss_bytes=exit_.max_rss_bytes, sim_cpu_s=sim_cpu,
                          sim_peak_running=_peak(window), machine_busy_cores=busy, job_mean_running=job_running)


def _peak(window: JobWindow) -> int:
    return window.window.peak_running if window.window else 0


def _progress(client: redis.Redis) -> dict[str, int]:
    from genfleet.status.read_model import read_progress

    totals = read_progress(client, "bench").totals()
    return {"done": totals.done, "failed": totals.failed, "completion_tokens": totals.completion_tokens}


@dataclass(frozen=True)
class Comparison:
    profile: Profile
    genfleet: SideResult
    baseline: SideResult

    @property
    def throughput_ratio(self) -> float:
        return self.genfleet.tokens_per_s / self.baseline.tokens_per_s

    @property
    def cpu_ratio(self) -> float:
        return self.genfleet.cpu_us_per_token / self.baseline.cpu_us_per_token

    @property
    def wall_ratio(self) -> float:
        return self.genfleet.wall_s / self.baseline.wall_s

    def to_dict(self) -> dict:
        return {"profile": asdict(self.profile), "genfleet": self.genfleet.to_dict(),
                "baseline": self.baseline.to_dict(), "throughput_ratio": self.throughput_ratio,
                "cpu_ratio": self.cpu_ratio, "wall_ratio": self.wall_ratio}


def in_turn(ours: Callable[[], T], baseline: Callable[[], SideResult], baseline_first: bool) -> tuple[T, SideResult]:
    """Both sides, one after the other; `baseline_first` alternates the order across repeats, so
    that neither always runs on the machine the other has just warmed (or heated)."""
    if baseline_first:
        theirs = baseline()
        return ours(), theirs
    mine = ours()
    return mine, baseline()


def compare(profile: Profile, workdir: Path, baseline_first: bool = False) -> Comparison:
    """Both sides on the same prompts; `baseline_first` alternates the order across repeats."""
    prompts = write_prompts(workdir / "prompts.jsonl", profile.prompts)
    fleet, baseline = in_turn(lambda: run_genfleet(profile, prompts), lambda: run_baseline(profile, prompts),
                              baseline_first)
    return Comparison(profile, fleet, baseline)


def chosen_profile(args: argparse.Namespace) -> Profile:
    """`--quick` and `--prompts N` of a bench script run alone, the profile it runs printed."""
    profile = QUICK if args.quick else FULL
    if args.prompts:
        profile = replace(profile, prompts=args.prompts)
    print(profile.describe(), flush=True)
    return profile


def main() -> None:
    import tempfile

    from bench.processes import interrupt_on_signals

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--prompts", type=int)
    parser.add_argument("--side", choices=["both", "genfleet", "baseline"], default="both")
    parser.add_argument("--py-spy", type=Path, help="genfleet side: record the worker's stacks into this file")
    args = parser.parse_args()
    interrupt_on_signals()
    profile = chosen_profile(args)
    with tempfile.TemporaryDirectory(prefix="genfleet-bench-") as tmp:
        if args.side == "both":
            print(json.dumps(compare(profile, Path(tmp)).to_dict(), indent=1, default=str))
            return
        prompts = write_prompts(Path(tmp) / "prompts.jsonl", profile.prompts)
        if args.side == "genfleet":
            result = run_genfleet(profile, prompts, py_spy=args.py_spy)
        else:
            result = run_baseline(profile, prompts)
        print(json.dumps(result.to_dict(), indent=1, default=str))


if __name__ == "__main__":
    main()
