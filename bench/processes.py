"""The processes a benchmark starts: redis-server, simulators, `genfleet` workers and one-shot
commands, each in its own session, all stopped on exit (Ctrl-C and SIGTERM included)."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis

REPO = Path(__file__).resolve().parent.parent
TOKENIZER = REPO / "sim" / "model"
STOP_GRACE_S = 15.0


# redis-py 8.0 gave every client a 5 s socket timeout (redis 8.2.0 `redis/_defaults.py`); a bench
# reads Redis beside a busy model server on 2 cores, where a read can wait longer than that.
REDIS_TIMEOUT_S = 60.0


def redis_client(url: str) -> redis.Redis:
    """The bench's own client of a Redis it watches."""
    return redis.Redis.from_url(url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def genfleet(*args: str) -> list[str]:
    return [sys.executable, "-m", "genfleet", *args]


def interrupt_on_signals() -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt, so `kill` cleans up like Ctrl-C does (SIGINT too
    when a shell started this in the background, where it is inherited as ignored)."""
    def _interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)


# Stop order: clients first (while their upstreams and broker still answer, so they exit at once
# instead of retrying), then the simulators, Redis last.
CLIENT, SERVER, BROKER = 2, 1, 0


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    log: Path
    tier: int = CLIENT

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""


class Processes:
    """Children of one benchmark run, in a temp dir that holds their logs and data.

    Each child gets its own session (process group), so a Ctrl-C at the terminal reaches only
    this script, which then stops the children in reverse order: SIGTERM, then SIGKILL.
    """

    def __init__(self, prefix: str = "genfleet-bench-", keep: bool = False) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        self.keep = keep
        self.children: list[Child] = []

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self.stop_all()
        finally:
            if not self.keep:
                shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, name: str, command: list[str], env: dict[str, str] | None = None, tier: int = CLIENT) -> Child:
        log = self.dir / f"{name}.log"
        with open(log, "wb") as handle:
            process = subprocess.Popen(command, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        child = Child(name, process, log, tier)
        self.children.append(child)
        return child

    def stop(self, child: Child, timeout: float = STOP_GRACE_S, sig: int = signal.SIGTERM) -> None:
        if child.alive():
            _signal_group(child.process, sig)
            try:
                child.process.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(child.process, signal.SIGKILL)
                child.process.wait()
        if child in self.children:
            self.children.remove(child)

    def stop_all(self) -> None:
        """Tier by tier, SIGTERM then SIGKILL; an interrupt during this kills the rest at once."""
        try:
            for tier in sorted({child.tier for child in self.children}, reverse=True):
                group = [child for child in self.children if child.tier == tier]
                for child in group:
                    if child.alive():
                        _signal_group(child.process, signal.SIGTERM)
                deadline = time.monotonic() + STOP_GRACE_S
                for child in group:
                    try:
                        child.process.wait(max(deadline - time.monotonic(), 0.1))
                    except subprocess.TimeoutExpired:
                        _signal_group(child.process, signal.SIGKILL)
                        child.process.wait()
        except BaseException:
            for child in self.children:
                if child.process.returncode is None:
                    _signal_group(child.process, signal.SIGKILL)
                    child.process.wait()
            raise
        finally:
            self.children.clear()

    def check_alive(self, ignore: Child | None = None) -> None:
        for child in self.children:
            if child is not ignore and not child.alive():
                raise RuntimeError(f"{child.name} exited ({child.process.returncode}):\n{child.tail()}")

    # -- the fleet's parts ----------------------------------------------------------------------

    def start_redis(self) -> tuple[Child, str]:
        """A throwaway redis-server; AOF off: the bench measures genfleet, not the disk."""
        binary = shutil.which("redis-server")
        if binary is None:
            sys.exit("redis-server is missing: `sudo apt-get install redis-server` (make bench does it as root)")
        port = free_port()
        data = self.dir / "redis"
        data.mkdir()
        child = self.start("redis", [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
                                     "--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction"],
                           tier=BROKER)
        client = redis_client(f"redis://127.0.0.1:{port}/0")
        wait_for(client.ping, "redis-server", child)
        return child, f"redis://127.0.0.1:{port}/0"

    def start_sim(self, name: str, flags: list[str], env: dict[str, str] | None = None) -> tuple[Child, str]:
        port = free_port()
        child = self.start(name, genfleet("sim", "--port", str(port), *flags), env, tier=SERVER)
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: httpx.get(f"{url}/health", timeout=1).status_code == 200, name, child)
        return child, url

    def start_worker(self, name: str, env: dict[str, str], upstreams: list[str], pool: str = "short") -> Child:
        """`genfleet worker --pool short` (or long) at its default log level, as a user runs it; not
        yet ready on return (see `wait_ready`)."""
        command = genfleet("worker", "--pool", pool, "--metrics-port", str(free_port()))
        for url in upstreams:
            command += ["--upstream", url]
        return self.start(name, command, env)

    def wait_ready(self, workers: list[Child], timeout: float = 90.0) -> None:
        """Every worker has logged Celery's 'ready.' line."""
        for worker in workers:
            # `worker=worker` binds this iteration's worker (wait_for returns before the loop moves on).
            wait_for(lambda worker=worker: "ready." in worker.log.read_text(errors="replace"), worker.name, worker,
                     timeout)


def wait_for(check: Callable[[], object], what: str, child: Child | None = None, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child is not None and not child.alive():
            raise RuntimeError(f"{what} exited during startup:\n{child.tail()}")
        try:
            if check():
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{what} not up after {timeout:.0f} s" + (f":\n{child.tail()}" if child else ""))


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass


def env_for(redis_url: str, output_dir: Path, **settings: object) -> dict[str, str]:
    """The environment of genfleet commands in a benchmark: its Redis, its shard dir."""
    env = {**os.environ, "GENFLEET_REDIS_URL": redis_url, "GENFLEET_OUTPUT_DIR": str(output_dir),
           "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    for name, value in settings.items():
        env[f"GENFLEET_{name.upper()}"] = str(value)
    return env
