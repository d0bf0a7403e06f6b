"""`make demo`: the whole pipeline on one box against the simulator, with Flower.

Starts redis-server (own port, temp dir), the simulator, a short and a long worker and Flower,
enqueues the bundled sample data, shows live progress and ends with a per-dataset summary.
Ctrl-C stops every process it started.
"""
from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import redis
from rich.live import Live

from genfleet.status.read_model import read_status
from genfleet.status.render import render, wide_console
from genfleet.status.snapshot import RunStatus

REPO = Path(__file__).resolve().parent.parent
TOKENIZER = REPO / "sim" / "model"
console = wide_console()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Processes:
    """Child processes in their own process groups, all stopped on exit (Ctrl-C included)."""

    def __init__(self, logs: Path, env: dict[str, str]) -> None:
        self.logs, self.env = logs, env
        self.children: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "w")
        process = subprocess.Popen(args, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        self.children.append((name, process))
        return process

    def check_alive(self) -> None:
        for name, process in self.children:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited ({process.returncode}); see {self.logs / (name + '.log')}")

    def stop_all(self) -> None:
        for _, process in reversed(self.children):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for _, process in reversed(self.children):
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)


def wait_for(check, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{what} did not come up within {timeout:.0f} s")


def genfleet(*args: str) -> list[str]:
    return [sys.executable, "-m", "genfleet", *args]


def main() -> None:
    args = _parse_args()
    if shutil.which("redis-server") is None:
        sys.exit("redis-server is missing: `sudo apt-get install redis-server` (make demo does it as root)")
    workdir = args.workdir.resolve()
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    redis_port, sim_port = free_port(), free_port()
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    run = time.strftime("demo-%Y%m%d-%H%M%S")
    # Flower runs only behind basic auth (docs/running.md): the demo makes a password unless given one.
    flower_auth = os.environ.get("GENFLEET_FLOWER_AUTH") or f"demo:{secrets.token_hex(8)}"
    env = {**os.environ, "GENFLEET_REDIS_URL": redis_url, "GENFLEET_OUTPUT_DIR": str(workdir / "output"),
           # The demo's records are small: a laptop with little free disk still runs it.
           "GENFLEET_MIN_FREE_DISK_MB": "16",
           "GENFLEET_FLOWER_AUTH": flower_auth, "PYTHONUNBUFFERED": "1"}
    datasets = _sample_datasets(workdir / "data", args.scale)

    processes = Processes(logs, env)
    with ExitStack() as stack:
        stack.callback(processes.stop_all)
        client = _start_redis(processes, stack, redis_port, redis_url)
        sim_url = f"http://127.0.0.1:{sim_port}"
        metrics_ports = _start_fleet(processes, sim_port, sim_url, args.flower_port)
        console.print(f"[bold]genfleet demo[/] run [cyan]{run}[/] · simulator {sim_url} · "
                      f"Flower http://127.0.0.1:{args.flower_port} (user:password {flower_auth}) · logs {logs}")
        console.print("Prometheus: " + " · ".join(f"{pool} http://127.0.0.1:{port}/metrics"
                                                  for pool, port in metrics_ports.items()))

        subprocess.run(genfleet("enqueue", "--run", run, "--tokenizer", str(TOKENIZER), *datasets),
                       env=env, check=True)
        status, elapsed = _show_progress_until_finished(client, run, processes)
        _print_summary(status, elapsed, workdir / "output" / run)
        if args.hold:
            console.print(f"Flower: http://127.0.0.1:{args.flower_port} · Ctrl-C to stop")
            while True:
                processes.check_alive()
                time.sleep(1)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Run the genfleet pipeline on sample data.")
    parser.add_argument("--workdir", type=Path, default=REPO / ".demo", help="data, shards and logs")
    parser.add_argument("--flower-port", type=int, default=5555)
    parser.add_argument("--scale", type=float, default=1.0, help="sample data size multiplier")
    parser.add_argument("--hold", action="store_true", help="keep everything running until Ctrl-C")
    return parser.parse_args()


def _sample_datasets(directory: Path, scale: float) -> list[str]:
    """Writes the bundled sample data and returns its `genfleet enqueue` dataset arguments."""
    # examples/ is not a package: its sample-data script is imported from its own folder.
    sys.path.insert(0, str(REPO / "examples"))
    from make_sample_data import dataset_args, write_datasets
    return dataset_args(write_datasets(directory, scale=scale))


def _start_redis(processes: Processes, stack: ExitStack, port: int, url: str) -> redis.Redis:
    redis_dir = Path(tempfile.mkdtemp(prefix="genfleet-redis-"))
    stack.callback(shutil.rmtree, redis_dir, True)
    # The broker settings docs/ARCHITECTURE.md asks for: AOF every second, never evict a queued task.
    processes.start("redis", "redis-server", "--port", str(port), "--bind", "127.0.0.1",
                    "--dir", str(redis_dir), "--appendonly", "yes", "--appendfsync", "everysec",
                    "--maxmemory-policy", "noeviction", "--save", "")
    client = redis.Redis.from_url(url)
    wait_for(client.ping, "redis-server")
    return client


def _start_fleet(processes: Processes, sim_port: int, sim_url: str, flower_port: int) -> dict[str, int]:
    """The simulator, a short and a long worker and Flower, up once both workers say `ready.`;
    returns each pool's Prometheus port."""
    processes.start("sim", *genfleet("sim", "--port", str(sim_port), "--length-scale", "0.1", "--rate", "100"))
    metrics_ports = {"short": free_port(), "long": free_port()}
    for pool, port in metrics_ports.items():
        processes.start(f"worker-{pool}", *genfleet("worker", "--pool", pool, "--upstream", sim_url,
                                                    "--metrics-port", str(port)))
    processes.start("flower", *genfleet("flower", "--port", str(flower_port)))
    logs = processes.logs
    wait_for(lambda: "ready." in (logs / "worker-short.log").read_text()
             and "ready." in (logs / "worker-long.log").read_text(), "the workers")
    return metrics_ports


def _show_progress_until_finished(client: redis.Redis, run: str, processes: Processes) -> tuple[RunStatus, float]:
    """The live status table until every prompt is done or failed; returns the last status and
    the seconds it took."""
    started = time.monotonic()
    with Live(render(read_status(client, run)), console=console, refresh_per_second=2) as live:
        while True:
            processes.check_alive()
            status = read_status(client, run)
            live.update(render(status))
            if status.finished:
                break
            time.sleep(0.5)
    return status, time.monotonic() - started


def _print_summary(status: RunStatus, elapsed: float, shards: Path) -> None:
    console.print()
    totals = status.progress.totals()
    console.print(f"[green]done[/]: {totals.done} prompts, {totals.failed} failed, "
                  f"{totals.completion_tokens:,} completion tokens in {elapsed:.1f} s "
                  f"({totals.completion_tokens / elapsed:,.0f} tok/s)")
    console.print(f"shards: {shards}")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        console.print("stopped")
        sys.exit(130)
