"""Two runs on one simulated host: one after the other, and sharing the fleet, B enqueued the moment
A's tail begins.

    .venv/bin/python -m bench.shared_tail [--quick] [--prompts N]

A run's tail begins when its queue empties: from then on no prompt is left to start, its last
completions (up to 150) run out one by one, and with the simulator's lognormal lengths (the throughput bench's
profile) the longest of them run almost alone. A steady-state window leaves that tail out; the
whole job's mean running count (`bench/steady_state.py` `JobWindow`, from the first enqueue to the
last record) counts it. Runs share the queues (`short`, `long`) and the workers, so B's prompts,
enqueued while A's tail runs, take the slots A's finished completions leave: the two runs finish
sooner than one after the other, while each keeps its own counters and its own shards
(`{out}/{run}/...`).

Per case, on a fresh fleet (redis-server, `genfleet sim`, one idle `genfleet worker --pool short`):
the wall time from A's `genfleet enqueue` to the last record counted done in Redis, the host's mean
running count over that time (÷ 150: the job's occupancy), and per run its own wall time, from its
enqueue command's start to its last record. Afterwards each run's shards must hold exactly its own
prompts, once each, and each run the same completion tokens in both cases (the simulator's
completions depend on the prompt alone), or the bench fails.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import redis

from bench import throughput
from bench.processes import TOKENIZER, Child, Processes, env_for, genfleet, redis_client
from bench.prompts import write_prompts
from bench.steady_state import JobWindow
from bench.throughput import SLOTS, Profile

POLL_S = 0.05
RUN_TIMEOUT_S = 600.0
RUNS = ("A", "B")
DATASET = "prompts"
CASES = ("one after the other", "sharing the fleet")

# Per run: the throughput bench's simulated host and completion lengths (lognormal, median 646 /
# mean 1,416 words × 0.3, cut at 2,048 tokens); half its prompts, so both cases fit in ~2 minutes.
FULL = replace(throughput.FULL, prompts=1000)
QUICK = replace(throughput.QUICK, prompts=200)


@dataclass(frozen=True)
class RunTimes:
    """One run inside a case; times in seconds since the case's first enqueue."""

    run: str
    enqueued_at: float  # its `genfleet enqueue` started
    finished_at: float  # its last record counted done
    prompts: int
    completion_tokens: int

    @property
    def wall_s(self) -> float:
        return self.finished_at - self.enqueued_at


@dataclass(frozen=True)
class CaseResult:
    case: str
    wall_s: float  # from the first enqueue to the last record
    job_mean_running: float  # the host's time-averaged running requests over that wall time
    tail_started_at: float  # A's queue emptied (seconds since the start)
    tail_mean_running: float  # from then until A's last record: A's tail alone, or A's and B's prompts
    runs: list[RunTimes] = field(default_factory=list)

    @property
    def job_occupancy(self) -> float:
        return self.job_mean_running / SLOTS

    @property
    def a(self) -> RunTimes:
        return self.runs[0]

    @property
    def a_tail_s(self) -> float:
        return self.a.finished_at - self.tail_started_at

    def to_dict(self) -> dict:
        return {**asdict(self), "job_occupancy": self.job_occupancy, "a_tail_s": self.a_tail_s,
                "run_walls": {r.run: r.wall_s for r in self.runs}}


class _Area:
    """Running × seconds of the host since the job's start, read off `JobWindow.job_mean_running`:
    the difference of two readings over their interval is the mean running count in between."""

    def __init__(self, window: JobWindow, started: float) -> None:
        self.window, self.started = window, started

    def now(self) -> tuple[float, float]:
        mean = self.window.job_mean_running()
        now = time.monotonic()
        return mean * (now - self.started), now


def run_case(profile: Profile, prompts: dict[str, Path], shared: bool) -> CaseResult:
    """A and B of `profile.prompts` each on a fresh fleet: B enqueued when A's queue empties
    (`shared`) or when A's last record is counted."""
    case = CASES[shared]
    with Processes(prefix="genfleet-bench-tail-") as procs:
        _, redis_url = procs.start_redis()
        _, sim_url = procs.start_sim("sim", profile.sim_flags())
        output = procs.dir / "output"
        env = env_for(redis_url, output)
        worker = procs.start_worker("worker", env, [sim_url])
        procs.wait_ready([worker])
        client = redis_client(redis_url)
        window = JobWindow([sim_url], 2 * profile.prompts)
        window.reset()
        started = time.monotonic()
        area = _Area(window, started)
        enqueues = {"A": _enqueue(procs, env, profile, "A", prompts["A"])}
        enqueued_at = {"A": 0.0}
        finished_at: dict[str, float] = {}
        tail: tuple[float, float] | None = None  # (area, time) when A's queue emptied
        tail_end: tuple[float, float] | None = None  # (area, time) at A's last record
        while len(finished_at) < len(RUNS):
            now = time.monotonic() - started
            if now > RUN_TIMEOUT_S:
                raise TimeoutError(f"{case}: not finished after {RUN_TIMEOUT_S:.0f} s ({finished_at})")
            for run, enqueue in enqueues.items():
                if enqueue.process.poll() not in (None, 0):
                    raise RuntimeError(f"genfleet enqueue --run {run} failed:\n{enqueue.tail()}")
            _check_fleet(procs, enqueues)
            progress = {run: _progress(client, run) for run in enqueues if run not in finished_at}
            # The queue is empty before A's enqueue has pushed anything too: wait for the command's exit.
            if tail is None and "A" in progress and enqueues["A"].process.poll() == 0 \
                    and progress["A"]["queued"] == 0:
                tail = area.now()
                if shared:
                    enqueues["B"], enqueued_at["B"] = _enqueue(procs, env, profile, "B", prompts["B"]), now
            for run, counts in progress.items():
                if counts["done"] < profile.prompts:
                    continue
                finished_at[run] = time.monotonic() - started
                if run == "A":
                    tail_end = area.now()
                    if not shared:
                        enqueues["B"] = _enqueue(procs, env, profile, "B", prompts["B"])
                        enqueued_at["B"] = time.monotonic() - started
            time.sleep(POLL_S)
        wall = max(finished_at.values())
        job_running = window.job_mean_running()
        window.close()
        if tail is None or tail_end is None:
            raise RuntimeError(f"{case}: A finished before its queue was seen empty; poll more often")
        runs = [RunTimes(run, enqueued_at[run], finished_at[run], profile.prompts,
                         _progress(client, run)["completion_tokens"]) for run in RUNS]
        for run in RUNS:
            _check_records(output, run, prompts[run])
    return CaseResult(case=case, wall_s=wall, job_mean_running=job_running, tail_started_at=tail[1] - started,
                      tail_mean_running=(tail_end[0] - tail[0]) / max(tail_end[1] - tail[1], 1e-9), runs=runs)


def _enqueue(procs: Processes, env: dict[str, str], profile: Profile, run: str, prompts: Path) -> Child:
    return procs.start(f"enqueue-{run}", genfleet("enqueue", "--run", run, "--tokenizer", str(TOKENIZER),
                                                   "--max-new-tokens", str(profile.max_new_tokens),
                                                   f"{DATASET}={prompts}"), env)


def _check_fleet(procs: Processes, enqueues: dict[str, Child]) -> None:
    """Every long-lived process is up (an enqueue command exits when done: not a failure)."""
    for child in procs.children:
        if child not in enqueues.values() and not child.alive():
            raise RuntimeError(f"{child.name} exited ({child.process.returncode}):\n{child.tail()}")


def _progress(client: redis.Redis, run: str) -> dict[str, int]:
    from genfleet.status.read_model import read_progress

    progress = read_progress(client, run)
    totals = progress.totals()
    if totals.failed:
        raise RuntimeError(f"run {run}: {totals.failed} prompts failed")
    return {"done": totals.done, "completion_tokens": totals.completion_tokens, "queued": progress.queued["short"]}


def _check_records(output: Path, run: str, prompts: Path) -> None:
    """The run's shards hold exactly its own prompts, once each: sharing the workers mixed nothing."""
    from genfleet.common.shards import ShardReader, find_shards

    # ShardReader raises on a record of another run in this run's shards (common/shards.py).
    ids = [line.record["id"] for line in ShardReader(find_shards([output], run), run)]
    expected = {f"{DATASET}/{json.loads(row)['id']}" for row in prompts.read_text().splitlines() if row}
    if len(ids) != len(expected) or set(ids) != expected:
        raise RuntimeError(f"run {run}: its shards hold {len(ids)} records ({len(set(ids) - expected)} not its "
                           f"own, {len(expected - set(ids))} of its prompts missing), expected {len(expected)}")


def compare(profile: Profile, workdir: Path) -> dict:
    """Both cases on the same two prompt sets; the raw figures `make bench` reports."""
    prompts = {run: write_prompts(workdir / f"{run}.jsonl", profile.prompts, seed=seed, prefix=run.lower())
               for seed, run in enumerate(RUNS, start=1)}
    apart, shared = (run_case(profile, prompts, shared) for shared in (False, True))
    for a, b in zip(apart.runs, shared.runs, strict=True):
        if a.completion_tokens != b.completion_tokens:
            raise RuntimeError(f"run {a.run}: {a.completion_tokens:,} completion tokens one after the other, "
                               f"{b.completion_tokens:,} sharing the fleet: not the same work")
    return {"workload": describe(profile), "cases": {"apart": apart.to_dict(), "shared": shared.to_dict()},
            "wall_ratio": shared.wall_s / apart.wall_s,
            "job_occupancy_gain": shared.job_occupancy - apart.job_occupancy}


def describe(profile: Profile) -> str:
    return f"two runs, A and B, each of {profile.describe()}"


def method(outcome: dict | None) -> str:
    """How section 9 of `make bench`'s report is measured, for its "How each figure is measured"."""
    workload = outcome["workload"] if outcome else ""
    return (f"`bench/shared_tail.py`: {workload}; a fresh fleet per case (redis-server, `genfleet sim`, one idle "
            "short worker); B enqueued when A's last record is counted (one after the other), or when A's `enqueue` "
            "has exited and the `short` queue is empty (sharing the fleet: A's last completions, at most 150, still "
            "run). Wall time: from A's `genfleet enqueue` to the last record counted done in Redis; each run's own, "
            "from its enqueue's start to its last record. Occupancy: the host's time-averaged running count over "
            "that wall time (`/sim/stats` `mean_running`, reset at A's enqueue, read at the last record: "
            "`bench/steady_state.py` `JobWindow`), ÷ 150. Each run's shards must hold exactly its own prompts, once "
            "each, and each run the same completion tokens in both cases.")


def runs_table(outcome: dict) -> list[str]:
    """Both cases, for the report's "Every run"."""
    lines = ["Shared tail (seconds since A's enqueue; A's tail: from its queue emptying to its last record):", "",
             "| case | wall s | whole job | A: enqueued → done | B: enqueued → done | A's tail | running in "
             "A's tail | tokens A \\| B |", "|---|---:|---:|---|---|---|---:|---:|"]
    for case in outcome["cases"].values():
        a, b = case["runs"]
        lines.append(f"| {case['case']} | {case['wall_s']:.1f} | {case['job_occupancy']:.1%} | "
                     f"{a['enqueued_at']:.1f} → {a['finished_at']:.1f} | {b['enqueued_at']:.1f} → "
                     f"{b['finished_at']:.1f} | {case['tail_started_at']:.1f} → {a['finished_at']:.1f} | "
                     f"{case['tail_mean_running']:.0f} | {a['completion_tokens']:,} \\| {b['completion_tokens']:,} |")
    return lines + [""]


def main() -> None:
    import tempfile

    from bench.processes import interrupt_on_signals

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the harness, measures nothing")
    parser.add_argument("--prompts", type=int, help="prompts per run")
    args = parser.parse_args()
    interrupt_on_signals()
    profile = QUICK if args.quick else FULL
    if args.prompts:
        profile = replace(profile, prompts=args.prompts)
    print(describe(profile), flush=True)
    with tempfile.TemporaryDirectory(prefix="genfleet-bench-tail-") as workdir:
        print(json.dumps(compare(profile, Path(workdir)), indent=1))


if __name__ == "__main__":
    main()
