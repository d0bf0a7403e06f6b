"""Drives real genfleet processes for end-to-end tests: enqueue, workers, progress, shards."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from genfleet.status.read_model import RunProgress, read_progress
from helpers.data import read_jsonl
from helpers.paths import TOKENIZER
from helpers.redis_server import observer
from helpers.waits import wait_until


@dataclass
class WorkerProcess:
    process: subprocess.Popen
    log: Path
    stopped: bool = False  # stopped on purpose: its exit is not a failure

    def wait_ready(self, timeout: float = 60.0) -> None:
        def ready() -> bool:
            if "ready." in self.log.read_text(errors="replace"):
                return True
            if self.process.poll() is not None:
                raise RuntimeError(f"worker exited with {self.process.returncode}:\n{self.tail()}")
            return False

        wait_until(ready, timeout, 0.1, lambda: f"worker not ready:\n{self.tail()}")

    def kill(self) -> None:
        self.stopped = True
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self, timeout: float = 30.0) -> None:
        self.stopped = True
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def warnings(self, lines: int = 10) -> str:
        """The log's last WARNING and ERROR lines (a lost broker connection, a retry), which a tail of
        task successes hides."""
        found = [line for line in self.log.read_text(errors="replace").splitlines()
                 if "WARNING/" in line or "ERROR/" in line or "CRITICAL/" in line]
        return "\n".join(found[-lines:])


def same_worker_overlaps(records: list[dict]) -> list[str]:
    """The ids that one worker ran twice at the same time: two records of one id by one worker whose
    start-to-end intervals overlap (a crash between write and ack leaves two records too, but one
    after the other, and a killed worker comes back under another name)."""
    spans: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for record in records:
        start = record["timing"]["started_at"]
        spans.setdefault((record["id"], record["worker"]), []).append((start, start + record["timing"]["duration_s"]))
    overlapping = []
    for (prompt_id, _worker), intervals in spans.items():
        intervals.sort()
        if any(earlier[1] > later[0] for earlier, later in zip(intervals, intervals[1:], strict=False)):
            overlapping.append(prompt_id)
    return sorted(overlapping)


def shard_records(output_dir: Path, run: str) -> list[dict]:
    """Every record line in the run's shards under `output_dir`, open and sealed, shard by shard."""
    return [record for shard in sorted((output_dir / run).glob("*/*.jsonl*")) for record in read_jsonl(shard)]


class Fleet:
    def __init__(self, redis_url: str, workdir: Path, **settings: object) -> None:
        self.redis_url = redis_url
        self.workdir = workdir
        self.output_dir = workdir / "output"
        self.env = {
            **os.environ,
            "GENFLEET_REDIS_URL": redis_url,
            "GENFLEET_OUTPUT_DIR": str(self.output_dir),
            "GENFLEET_COMMIT_INTERVAL_S": "0.02",
            # No /metrics on the pools' fixed default ports: a test asks for a free one.
            "GENFLEET_METRICS_PORT": "0",
            # Small test records: a test machine with little free disk must not stall the fleet.
            "GENFLEET_MIN_FREE_DISK_MB": "1",
            "PYTHONUNBUFFERED": "1",
        }
        self.configure(**settings)
        self.workers: list[WorkerProcess] = []
        self.redis = observer(redis_url)

    def configure(self, **settings: object) -> None:
        """Settings for processes started from now on, as GENFLEET_* env vars."""
        for name, value in settings.items():
            self.env[f"GENFLEET_{name.upper()}"] = str(value)

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *_: object) -> None:
        for worker in self.workers:
            worker.stop(timeout=15)

    def genfleet(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        result = subprocess.run([sys.executable, "-m", "genfleet", *args], env=self.env, cwd=self.workdir,
                                capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"genfleet {' '.join(args)} failed ({result.returncode}):\n"
                                 f"{result.stdout}\n{result.stderr}")
        return result

    def enqueue(self, run: str, *datasets: str, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
        return self.genfleet("enqueue", "--run", run, "--tokenizer", str(TOKENIZER), *extra, *datasets)

    def start_worker(self, pool: str, *upstreams: str, concurrency: int | None = None,
                     wait: bool = True, metrics_port: int | None = None,
                     env: dict[str, str] | None = None) -> WorkerProcess:
        """`env`: more environment for this worker alone (a fault injected into its process)."""
        log = self.workdir / f"worker-{pool}-{len(self.workers)}.log"
        args = [sys.executable, "-m", "genfleet", "worker", "--pool", pool, "--loglevel", "INFO"]
        for url in upstreams:
            args += ["--upstream", url]
        if concurrency:
            args += ["--concurrency", str(concurrency)]
        if metrics_port:
            args += ["--metrics-port", str(metrics_port)]
        handle = open(log, "w")
        process = subprocess.Popen(args, env={**self.env, **(env or {})}, cwd=self.workdir, stdout=handle,
                                   stderr=subprocess.STDOUT)
        worker = WorkerProcess(process, log)
        self.workers.append(worker)
        if wait:
            worker.wait_ready()
        return worker

    def progress(self, run: str) -> RunProgress:
        return read_progress(self.redis, run)

    def wait_finished(self, run: str, timeout: float = 180.0) -> RunProgress:
        def finished() -> RunProgress | None:
            progress = self.progress(run)
            if progress.datasets and progress.finished:
                return progress
            for worker in self.workers:
                if not worker.stopped and worker.process.poll() is not None:
                    raise RuntimeError(f"a worker died:\n{worker.tail()}")
            return None

        def details() -> str:
            # The summary last: CI prints a failure's first and last lines and cuts the middle.
            tails = "\n\n".join(f"{w.tail(15)}\n-- its warnings:\n{w.warnings()}" for w in self.workers)
            return f"{tails}\nrun {run} not finished: {self.progress(run)}"

        return wait_until(finished, timeout, 0.25, details)

    def records(self, run: str) -> list[dict]:
        """Every record line in the run's shards, open and sealed."""
        return shard_records(self.output_dir, run)

    def record_counts(self, run: str) -> Counter:
        return Counter(record["id"] for record in self.records(run))
