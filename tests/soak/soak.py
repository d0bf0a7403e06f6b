"""`make soak`: a seeded chaos soak of a whole fleet, judged from the outside.

A fleet as deployed, scaled down: Redis with AOF (everysec) behind a proxy that can blackhole it,
two simulated SGLang hosts, two short workers and one long worker listing both hosts, three
datasets. For `--minutes`, a fault drawn from `--seed` strikes every 10-25 s (`FAULTS`): a worker
SIGKILLed and started again, a worker paused past its lease or within it, Redis SIGKILLed, shut
down, or killed with the last second of its AOF cut away (an OS crash's loss under `everysec`), a
host killed and started again, a burst of host faults, the output disk full, the workers' Redis
traffic blackholed; and starvation, which kills nothing: every core held by busy processes for
10-40 s, a worker or Redis frozen (SIGSTOP/SIGCONT) for 50-900 ms many times in a row, the workers'
fsync delayed by seconds (an LD_PRELOAD shim, tests/helpers/slow_fsync). Every fault heals before
the next.

Then it judges what a user would check, from outside genfleet's own counters:
- every prompt's record on disk, equal to what a simulator generated for it (its `output_ids`,
  from the simulators' completion logs), and in the export exactly once (export exit 0);
- no dead letter; `genfleet status --json` agrees with the records; the run finished within
  `FINISH_AFTER_HEAL_S` of the last heal;
- no prompt run twice at once by one worker (two records of one id by one worker whose
  start-to-end intervals overlap);
- generations beyond one per prompt (whole completions in the simulators' logs) at most the
  streams the faults themselves killed (`Fault.bound`): a killed or long-paused worker's in-flight
  cap, the streams in flight on a killed or faulty host or through a full disk, the records
  started or finished in an AOF's lost second. Redis restarts, shutdowns and blackholes, pauses
  within a lease, starved CPUs, short freezes and a slow disk cost nothing.

Prints a fault log and a one-line summary naming the seed (`--seed N` replays the same faults at
the same times; the machine's timing still varies), and exits 1 if any judgement fails. Needs root
for the full disk (a tmpfs); elsewhere that fault is left out and the summary says so.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the e2e helpers

from helpers.data import write_jsonl  # noqa: E402
from helpers.fleet import Fleet, WorkerProcess, same_worker_overlaps  # noqa: E402
from helpers.redis_server import RedisServer, observer  # noqa: E402
from helpers.sim_process import SimProcess, free_port, read_completion_log  # noqa: E402
from helpers.tcp_proxy import BlackholeProxy  # noqa: E402
from helpers.tmpfs import fill  # noqa: E402
from helpers.waits import wait_until  # noqa: E402

from genfleet.common.run_state import RunState  # noqa: E402

RUN = "soak"
# A 15 s lease renewed every 4 s, a reaper every 3 s: the documented settings, shortened.
SETTINGS = dict(lease_ttl_s=15, lease_heartbeat_s=4, reaper_interval_s=3, retry_backoff_s=0.5,
                retry_backoff_max_s=5, max_attempts=40, stall_timeout_s=8, breaker_open_s=2,
                health_interval_s=1, shutdown_grace_s=5, disk_wait_s=600)
LEASE_S = SETTINGS["lease_ttl_s"]
POOLS = (("short", 8), ("short", 8), ("long", 4))  # (pool, in-flight cap) of each worker
# ~6-9 s completions: every fault finds streams in flight.
HOST = ("--rate", "10", "--knee", "100000", "--length-median", "60", "--length-mean", "75")
BURST = ("--http-500-rate", "0.2", "--abort-rate", "0.1", "--error-chunk-rate", "0.1", "--stall-rate", "0.05",
         "--drop-chunk-rate", "0.05")
# About what the fleet finishes in a minute through the faults: work in flight the whole soak.
PROMPTS_PER_MINUTE = 120
FINISH_AFTER_HEAL_S = 120.0


@dataclass
class Fault:
    kind: str
    at: float  # seconds into the soak
    detail: str = ""
    bound: int = 0  # generations it may cost: the streams it killed


@dataclass
class Soak:
    seed: int
    minutes: float
    workdir: Path
    kinds: list[str] = field(default_factory=lambda: list(FAULTS))  # the faults to draw from
    first: list[str] = field(default_factory=list)  # struck first, in this order, before any drawn
    faults: list[Fault] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.random = random.Random(self.seed)
        self.redis = RedisServer(self.workdir / "redis", "--appendonly", "yes", "--appendfsync", "everysec",
                                 "--auto-aof-rewrite-percentage", "0")
        self.output = self.workdir / "output"  # the Fleet's output directory
        self.tmpfs = _mount_tmpfs(self.output)
        self.hosts: list[SimProcess] = []
        self.host_logs: list[Path] = []
        self.aof_sizes: list[tuple[float, int]] = []  # (monotonic, bytes of the AOF's incr file)
        self.last_heal = time.monotonic()
        self.finished_at: float | None = None  # when the run was first seen finished (monotonic)
        self._finish_checked_at = 0.0
        # The slow disk's switch: while this file exists, every worker's fsync waits the seconds in it.
        self.fsync_delay = self.workdir / "fsync-delay"
        shim = _build_slow_fsync(self.workdir)
        self.worker_env = ({"LD_PRELOAD": str(shim), "GENFLEET_TEST_FSYNC_DELAY_FILE": str(self.fsync_delay)}
                           if shim else {})

    # -- the fleet ---------------------------------------------------------------------------------
    def run(self) -> int:
        self.redis.start()
        with BlackholeProxy(self.redis.port) as proxy:
            self.proxy = proxy
            # The workers reach Redis through the proxy; the judge (and enqueue, status) directly.
            self.fleet = Fleet(f"redis://127.0.0.1:{proxy.port}/0", self.workdir, **SETTINGS)
            self.judge_redis = observer(self.redis.url)
            self.fleet.redis = self.judge_redis
            try:
                return self._run()
            finally:
                for worker in self.fleet.workers:
                    worker.stop(timeout=10)
                for host in self.hosts:
                    host.stop()
                self.redis.stop()
                # The shards, kept beside the logs for a failure's post-mortem (the tmpfs goes).
                if (self.output / RUN).is_dir():
                    shutil.copytree(self.output / RUN, self.workdir / "records", dirs_exist_ok=True)
                if self.tmpfs:
                    subprocess.run(["umount", "-l", str(self.output)], check=False)

    def _run(self) -> int:
        for index in range(2):
            self._start_host(index, free_port())
        urls = [host.url for host in self.hosts]
        self.workers = [self.fleet.start_worker(pool, *urls, concurrency=cap, env=self.worker_env)
                        for pool, cap in POOLS]
        datasets = self._write_datasets()
        self.fleet.enqueue(RUN, *datasets, extra=("--keep-token-ids",))
        started = time.monotonic()
        self.started = started
        end = started + self.minutes * 60
        drawn = "" if set(self.kinds) == set(FAULTS) else f" drawn from {', '.join(self.kinds)}"
        print(f"soak seed {self.seed}: {self.total} prompts, {self.minutes:g} min of faults{drawn}", flush=True)
        while True:
            self._sleep(self.random.uniform(10, 25))
            if time.monotonic() >= end:
                break
            kind = self.first.pop(0) if self.first else self.random.choice(self.kinds)
            fault = Fault(kind, round(time.monotonic() - started, 1))
            FAULTS[kind](self, fault)
            self.last_heal = time.monotonic()
            self.faults.append(fault)
            bound = "from the records" if fault.bound < 0 else fault.bound
            print(f"  {fault.at:7.1f} s  {fault.kind:<19} {fault.detail}  (bound {bound})", flush=True)
        finish_s: float | None = None
        try:
            if self.finished_at is None:
                self.fleet.wait_finished(RUN, timeout=max(self.last_heal + FINISH_AFTER_HEAL_S - time.monotonic(), 1))
                self.finished_at = time.monotonic()
            finish_s = self.finished_at - self.last_heal  # negative: done before the faults ended
        except AssertionError as error:
            print(f"not finished {FINISH_AFTER_HEAL_S:g} s after the last heal: {error}", flush=True)
        # Every copy of every message ended: a second copy still streaming would write later.
        wait_until(lambda: self.judge_redis.hlen("unacked") == 0 and all(h.stats()["running"] == 0 for h in self.hosts),
                   timeout=60, message="copies still running after the run finished")
        return self._judge(finish_s)

    def _start_host(self, index: int, port: int, *flags: str) -> None:
        log = self.workdir / f"host{index}-{len(self.host_logs)}.jsonl"
        self.host_logs.append(log)
        host = SimProcess(*HOST, "--log-completions", str(log), *flags, port=port)
        host.start()
        if index < len(self.hosts):
            self.hosts[index] = host
        else:
            self.hosts.append(host)

    def _write_datasets(self) -> list[str]:
        self.total = max(int(PROMPTS_PER_MINUTE * self.minutes), 30)
        sizes = {"chat": self.total // 2, "code": self.total // 3}
        sizes["swe"] = self.total - sum(sizes.values())
        arguments = []
        for name, size in sizes.items():
            path = write_jsonl(self.workdir / f"{name}.jsonl",
                               [{"prompt": f"{name} question {row} of the soak"} for row in range(size)])
            arguments.append(f"{name}={path}" + (":long" if name == "swe" else ""))
        return arguments

    def _sleep(self, seconds: float) -> None:
        """Sleeps, sampling the AOF's size (for the cut of its last second) and watching for the run's end."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self._sample_aof()
            self._note_finish()
            time.sleep(min(left, 0.2))

    def _note_finish(self) -> None:
        if self.finished_at is None and time.monotonic() - self._finish_checked_at >= 1.0:
            self._finish_checked_at = time.monotonic()
            with contextlib.suppress(redis.RedisError):
                progress = self.fleet.progress(RUN)
                if progress.datasets and progress.finished:
                    self.finished_at = time.monotonic()

    def _sample_aof(self) -> None:
        incr = _incr_file(self.redis.directory)
        if incr is not None:
            self.aof_sizes.append((time.monotonic(), incr.stat().st_size))
            self.aof_sizes = self.aof_sizes[-50:]

    def _pick_worker(self) -> tuple[int, WorkerProcess]:
        index = self.random.randrange(len(self.workers))
        return index, self.workers[index]

    def _restart_redis(self, down_s: float) -> None:
        time.sleep(down_s)
        self.redis.start(timeout=30)

    def _streams(self) -> int:
        return sum(host.stats()["running"] for host in self.hosts if host.alive)

    def _started(self) -> int:
        return sum(host.stats()["requests_started"] for host in self.hosts if host.alive)

    # -- judging -----------------------------------------------------------------------------------
    def _judge(self, finish_s: float | None) -> int:
        settle_aof_bounds(self)
        records = self.fleet.records(RUN)
        ids = {record["id"] for record in records}
        expected = {f"{name}/{row}" for name, size in self._sizes().items() for row in range(size)}
        # Every whole completion a host sent: a line whose stream reached its finish. Its ids are what
        # the host generated even where a fault struck the wire (a dropped chunk, a miscount: the line
        # keeps the true ids), so a record must equal one of them; a worker that took a corrupted
        # stream for a whole one would write ids no line has.
        whole = [line for path in self.host_logs if path.exists() for line in read_completion_log(path)
                 if (line.get("finish_reason") or {}).get("type") in ("stop", "length")]
        generated = Counter(tuple(line["input_ids"]) for line in whole)
        by_output = {tuple(line["output_ids"]): tuple(line["input_ids"]) for line in whole}
        inexact = [r["id"] for r in records if tuple(r.get("output_ids") or ()) not in by_output]
        prompts_of = Counter(by_output.get(tuple(r.get("output_ids") or ())) for r in records)
        extra = sum(count - 1 for count in generated.values())
        bound = sum(fault.bound for fault in self.faults)
        twice = sum(count - 1 for count in Counter(r["id"] for r in records).values())
        overlaps = same_worker_overlaps(records)
        dead = RunState(self.judge_redis, RUN).dead_letters()
        status = json.loads(self.fleet.genfleet("status", "--run", RUN, "--json").stdout)
        export = self.fleet.genfleet("export", "--run", RUN, "--from", str(self.output), "--out",
                                     str(self.workdir / "export"), "--format", "openai", check=False)
        exported = Counter(json.loads(line)["id"] for path in (self.workdir / "export" / "datasets").glob("*.jsonl")
                           for line in path.read_text().splitlines() if line.strip())
        checks = {
            "every prompt has a record": ids == expected,
            "every record is what a host generated": not inexact and len(prompts_of) == len(ids),
            "0 dead letters": not dead,
            "export exit 0, each prompt once": export.returncode == 0 and set(exported) == expected
            and set(exported.values()) == {1},
            "status agrees with the records": status["totals"]["done"] == len(ids) and status["finished"],
            f"finished within {FINISH_AFTER_HEAL_S:g} s of the last heal": finish_s is not None,
            "0 prompts run twice at once by one worker": not overlaps,
        }
        if all(fault.kind in STARVATION for fault in self.faults):
            # Nothing was killed, so every generation beyond one is starvation's alone, and must be none.
            checks["0 generations beyond one (starvation alone)"] = extra == 0
        else:
            checks["generations beyond one <= the streams faults killed"] = extra <= bound
        kinds = Counter(fault.kind for fault in self.faults)
        print("faults: " + ", ".join(f"{kind} {count}" for kind, count in sorted(kinds.items())), flush=True)
        bounds = [f"{fault.kind}@{fault.at:g}s {fault.bound}" for fault in self.faults if fault.bound]
        print("bounds: " + ", ".join(bounds), flush=True)
        for name, held in checks.items():
            print(f"  {'ok  ' if held else 'FAIL'} {name}", flush=True)
        if inexact:
            print(f"  records no host generated: {inexact[:5]}", flush=True)
        if overlaps:
            print(f"  run twice at once: {overlaps[:5]}", flush=True)
        if export.returncode:
            print(f"  export: {export.stdout[-500:]}{export.stderr[-500:]}", flush=True)
        verdict = "passed" if all(checks.values()) else "FAILED"
        print(f"soak seed={self.seed} minutes={self.minutes:g}: {verdict}; {len(self.faults)} faults; "
              f"{len(ids)}/{len(expected)} prompts; generations beyond one {extra} (bound {bound}); "
              f"records written twice {twice}; dead letters {len(dead)}; finished "
              + ("never" if finish_s is None else f"{abs(finish_s):.0f} s {'after' if finish_s >= 0 else 'before'}")
              + " the last heal"
              + ("" if self.tmpfs else "; disk-full left out (no tmpfs: needs root)"), flush=True)
        return 0 if all(checks.values()) else 1

    def _sizes(self) -> dict[str, int]:
        return {path.stem: len(path.read_text().splitlines()) for path in self.workdir.glob("*.jsonl")
                if path.stem in ("chat", "code", "swe")}


# -- the faults ------------------------------------------------------------------------------------
def worker_killed(soak: Soak, fault: Fault) -> None:
    index, worker = soak._pick_worker()
    pool, cap = POOLS[index]
    worker.kill()
    fault.detail, fault.bound = f"{pool} worker {index}", cap
    soak.workers[index] = soak.fleet.start_worker(pool, *[h.url for h in soak.hosts], concurrency=cap,
                                                  env=soak.worker_env)


def worker_paused_past_lease(soak: Soak, fault: Fault) -> None:
    index, worker = soak._pick_worker()
    pause = LEASE_S + soak.random.uniform(3, 10)
    _pause(worker, pause)
    fault.detail, fault.bound = f"worker {index} for {pause:.0f} s", POOLS[index][1]


def worker_paused_briefly(soak: Soak, fault: Fault) -> None:
    index, worker = soak._pick_worker()
    pause = soak.random.uniform(1, LEASE_S / 3)
    _pause(worker, pause)
    fault.detail = f"worker {index} for {pause:.1f} s"


def _pause(worker: WorkerProcess, seconds: float) -> None:
    worker.process.send_signal(signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        worker.process.send_signal(signal.SIGCONT)


def redis_killed(soak: Soak, fault: Fault) -> None:
    soak.redis.kill()
    down = soak.random.uniform(1, 6)
    soak._restart_redis(down)
    fault.detail = f"SIGKILL, down {down:.1f} s"


def redis_shut_down(soak: Soak, fault: Fault) -> None:
    soak.redis.stop()
    down = soak.random.uniform(1, 6)
    soak._restart_redis(down)
    fault.detail = f"shutdown, down {down:.1f} s"


def redis_aof_cut(soak: Soak, fault: Fault) -> None:
    """SIGKILL, then the AOF cut back to its size a second earlier: what `appendfsync everysec` loses
    when the machine itself crashes. Redis loads the cut tail (`aof-load-truncated yes`, its default)."""
    killed_at = time.time()
    soak._sample_aof()
    soak.redis.kill()
    incr = _incr_file(soak.redis.directory)
    earlier = [size for at, size in soak.aof_sizes if at <= time.monotonic() - 1.0]
    cut = 0
    if incr is not None and earlier:
        size = incr.stat().st_size
        cut = max(size - earlier[-1], 0)
        with open(incr, "r+b") as handle:
            handle.truncate(earlier[-1])
    soak._restart_redis(soak.random.uniform(1, 4))
    # What the lost second can cost: prompts finished in it (their done bit and ack are gone) and
    # prompts taken in it (their message is back in the queue while they run): read from the records
    # once they are all written, by the window's wall-clock times.
    soak.lost_windows = getattr(soak, "lost_windows", []) + [(killed_at - 1.2, killed_at)]
    fault.detail = f"SIGKILL, {cut} bytes of AOF cut"
    fault.bound = -1  # settled by `settle_aof_bounds`


def host_killed(soak: Soak, fault: Fault) -> None:
    index = soak.random.randrange(len(soak.hosts))
    host = soak.hosts[index]
    streams = host.stats()["running"]
    host.kill()
    down = soak.random.uniform(2, 8)
    time.sleep(down)
    soak._start_host(index, host.port)
    fault.detail, fault.bound = f"host {index}, down {down:.1f} s, {streams} streams", streams


def host_fault_burst(soak: Soak, fault: Fault) -> None:
    index = soak.random.randrange(len(soak.hosts))
    host = soak.hosts[index]
    before = host.stats()["running"]
    host.kill()
    soak._start_host(index, host.port, *BURST, "--fault-seed", str(soak.random.randrange(10**6)))
    length = soak.random.uniform(8, 15)
    time.sleep(length)
    burst = soak.hosts[index].stats()
    soak.hosts[index].kill()
    soak._start_host(index, host.port)
    fault.detail = f"host {index} faulty for {length:.0f} s"
    fault.bound = before + burst["requests_started"]


def disk_full(soak: Soak, fault: Fault) -> None:
    if not soak.tmpfs:
        fault.detail = "left out: no tmpfs"
        return
    streams, started = soak._streams(), soak._started()
    filler = fill(soak.output)
    length = soak.random.uniform(5, 12)
    time.sleep(length)
    filler.unlink()
    fault.detail = f"full for {length:.0f} s"
    fault.bound = streams + max(soak._started() - started, 0)


def redis_blackholed(soak: Soak, fault: Fault) -> None:
    length = soak.random.uniform(5, 15)
    soak.proxy.blackhole()
    try:
        time.sleep(length)
    finally:
        soak.proxy.heal()
    fault.detail = f"{length:.1f} s"


def cpu_starved(soak: Soak, fault: Fault) -> None:
    """Every core held by busy processes beside the fleet (a noisy neighbour, a tokenizer load, a page
    cache flush): the fleet's processes still get their share, so no lease lapses; it costs time only."""
    hogs = 2 * (os.cpu_count() or 1)
    length = soak.random.uniform(10, 40)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs)]
    try:
        time.sleep(length)
    finally:
        for process in busy:
            process.kill()
        for process in busy:
            process.wait()
    fault.detail = f"{hogs} busy processes for {length:.0f} s"


def frozen_briefly(soak: Soak, fault: Fault) -> None:
    """A worker, or Redis, stopped and continued many times in a row, each stop far shorter than a
    lease (a GC pause, a VM steal, a throttled cgroup)."""
    freezes = soak.random.randint(10, 30)
    if soak.random.random() < 0.5 and soak.redis.process is not None:
        target, process = "Redis", soak.redis.process
    else:
        index, worker = soak._pick_worker()
        target, process = f"worker {index}", worker.process
    longest = 0.0
    for _ in range(freezes):
        stop = soak.random.uniform(0.05, 0.9)
        longest = max(longest, stop)
        process.send_signal(signal.SIGSTOP)
        try:
            time.sleep(stop)
        finally:
            process.send_signal(signal.SIGCONT)
        time.sleep(soak.random.uniform(0.05, 0.5))
    fault.detail = f"{target} {freezes} times, up to {longest * 1000:.0f} ms"


def disk_slow(soak: Soak, fault: Fault) -> None:
    """Every worker's fsync delayed by seconds (the LD_PRELOAD shim): records are acknowledged late,
    none lost, none generated again."""
    if not soak.worker_env:
        fault.detail = "left out: no C compiler for the fsync shim"
        return
    delay, length = soak.random.uniform(1, 4), soak.random.uniform(10, 25)
    soak.fsync_delay.write_text(f"{delay:.2f}")
    try:
        time.sleep(length)
    finally:
        soak.fsync_delay.unlink()
    fault.detail = f"fsync +{delay:.1f} s for {length:.0f} s"


FAULTS: dict[str, Callable[[Soak, Fault], None]] = {
    "worker-killed": worker_killed, "worker-paused-long": worker_paused_past_lease,
    "worker-paused-short": worker_paused_briefly, "redis-killed": redis_killed, "redis-shutdown": redis_shut_down,
    "redis-aof-cut": redis_aof_cut, "host-killed": host_killed, "host-fault-burst": host_fault_burst,
    "disk-full": disk_full, "redis-blackholed": redis_blackholed,
    "cpu-starved": cpu_starved, "frozen-briefly": frozen_briefly, "disk-slow": disk_slow,
}
# What starves the fleet without killing anything: each must add 0 generations.
STARVATION = ("cpu-starved", "frozen-briefly", "disk-slow")


def settle_aof_bounds(soak: Soak) -> None:
    """An AOF cut's bound: the records started or finished in its lost second."""
    records = soak.fleet.records(RUN)
    for fault, (start, end) in zip([f for f in soak.faults if f.kind == "redis-aof-cut"],
                                   getattr(soak, "lost_windows", []), strict=False):
        fault.bound = sum(1 for r in records
                          if start <= r["timing"]["started_at"] <= end
                          or start <= r["timing"]["started_at"] + r["timing"]["duration_s"] <= end)


def _build_slow_fsync(directory: Path) -> Path | None:
    """The fsync shim built for this soak, or None without a C compiler (the slow disk is left out)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    shim = directory / "libslowfsync.so"
    source = Path(__file__).resolve().parents[1] / "helpers" / "slow_fsync" / "slow_fsync.c"
    built = subprocess.run([compiler, "-shared", "-fPIC", "-o", str(shim), str(source), "-ldl"], capture_output=True)
    return shim if built.returncode == 0 else None


def _incr_file(directory: Path) -> Path | None:
    files = sorted((directory / "appendonlydir").glob("*.incr.aof"))
    return files[-1] if files else None


def _mount_tmpfs(path: Path) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--minutes", type=float, default=8.0)
    parser.add_argument("--workdir", type=Path, help="where the soak's files go (default: a new temp dir)")
    parser.add_argument("--faults", default=",".join(FAULTS),
                        help="the kinds to draw from, comma-separated (default: all); e.g. the ones that must cost "
                             "nothing: redis-killed,redis-shutdown,redis-blackholed,worker-paused-short")
    parser.add_argument("--first", default="",
                        help="kinds struck first, in this order, before any drawn (e.g. CI's: cpu-starved)")
    args = parser.parse_args()
    kinds = [kind.strip() for kind in args.faults.split(",") if kind.strip()]
    first = [kind.strip() for kind in args.first.split(",") if kind.strip()]
    if not kinds or set(kinds) - set(FAULTS) or set(first) - set(FAULTS):
        parser.error(f"--faults and --first take some of: {', '.join(FAULTS)}")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix=f"genfleet-soak-{args.seed}-"))
    if workdir.exists() and any(workdir.iterdir()):
        parser.error(f"--workdir {workdir} is not empty: a soak starts from nothing (its Redis, logs, shards)")
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"soak files in {workdir}", flush=True)
    return Soak(args.seed, args.minutes, workdir, kinds, first).run()


if __name__ == "__main__":
    sys.exit(main())
