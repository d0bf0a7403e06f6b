"""The Redis a one-box job owns: a `redis-server` whose data lives under the output directory, so
that the job, and every command run on it later, needs no Redis set up by hand.

Everything is in `{output dir}/.genfleet-redis/`:
- `redis.conf` (0600): the settings below and the password. They are kept in a file, not on the
  command line, where every user's `ps` would show the password.
- `password` (0600): generated once (`secrets.token_urlsafe`), kept across restarts.
- `endpoint.json`: where the running server listens and its pid. It is removed at a clean stop.
- `appendonlydir/`: the data (AOF, `appendfsync everysec`). A restart, or a re-run of the same
  `genfleet run`, loads it again, so the run resumes where it stopped.
- `redis.log`: the server's log.

The settings are the broker's, as docs/ARCHITECTURE.md asks: AOF on, `maxmemory-policy noeviction`
(a queued prompt is never evicted), no RDB snapshots. It listens on 127.0.0.1, on a free port
chosen at each start, unless `--listen ADDR:PORT` exposes it to other hosts (the password then
guards it; protected mode only applies to a server with no password and no `bind`: redis.conf's
"protected-mode" comment, redis 7).

`reach_redis` is how `status`, `failures`, `requeue`, `recover` and `export` find it: with no
`--redis-url` and no `GENFLEET_REDIS_URL`, an output directory that holds an embedded Redis is
served by it, started for the command's duration when it is not running.

Who stops it: every command that uses the server holds a shared lock on `users` while it does, and
the last one to stop using it stops it (a `status --watch` that started it does not stop it under a
job that began meanwhile; the job does, at its end). `genfleet run` starts it tied
to its own life (it dies with the job, even after `kill -9`: `processes.py`); a command run on the
job's output afterwards starts it untied, so that a job using it meanwhile keeps it. One
`genfleet run` at a time per output directory (`job.lock`): two would share its queues.
"""
from __future__ import annotations

import fcntl
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO
from urllib.parse import quote

import redis

from genfleet import ToolError
from genfleet.common.settings import Settings
from genfleet.onebox.processes import dies_with_parent, free_port

DIRECTORY = ".genfleet-redis"
START_TIMEOUT_S = 60.0  # a large AOF takes a while to load
REDIS_MISSING = ("redis-server is not on PATH: install it (Debian/Ubuntu: `sudo apt-get install redis-server`, "
                 "macOS: `brew install redis`), or point GENFLEET_REDIS_URL at a Redis you run")


class EmbeddedRedisError(ToolError):
    """The embedded Redis could not be started or reached; the message says why and where its log is."""


@dataclass(frozen=True)
class Listen:
    """`--listen ADDR:PORT`: the address other hosts reach the embedded Redis on."""

    address: str
    port: int

    @classmethod
    def parse(cls, text: str) -> Listen:
        address, sep, port = text.rpartition(":")
        address = address.strip("[]")
        if not sep or not address or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"--listen {text!r}: expected ADDR:PORT, e.g. 0.0.0.0:6379")
        return cls(address, int(port))


@dataclass(frozen=True)
class Endpoint:
    host: str  # where this machine's own clients connect
    port: int
    pid: int
    listen: str | None  # the address other hosts use, when exposed


class EmbeddedRedis:
    """The embedded Redis of one output directory."""

    def __init__(self, output_dir: Path) -> None:
        self.directory = output_dir.resolve() / DIRECTORY
        self.process: subprocess.Popen | None = None  # when this process started it
        self._use: IO[str] | None = None  # this process's shared lock on `users` while it uses the server

    # --- state on disk ----------------------------------------------------------------------
    def exists(self) -> bool:
        """Whether a job on this output directory has used an embedded Redis."""
        return (self.directory / "password").is_file()

    def password(self) -> str:
        path = self.directory / "password"
        if not path.exists():
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as file:
                file.write(secrets.token_urlsafe(24))
        return path.read_text().strip()

    def endpoint(self) -> Endpoint | None:
        try:
            data = json.loads((self.directory / "endpoint.json").read_text())
            return Endpoint(data["host"], int(data["port"]), int(data["pid"]), data.get("listen"))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def url(self, endpoint: Endpoint, host: str | None = None) -> str:
        """A Redis URL with the password, for this machine (or for `host`, another's view)."""
        host = host or endpoint.host
        if ":" in host:  # an IPv6 address goes in brackets in a URL
            host = f"[{host.strip('[]')}]"
        return f"redis://:{quote(self.password(), safe='')}@{host}:{endpoint.port}/0"

    def claim_job(self) -> IO[str] | None:
        """The output directory's one `genfleet run`: a lock held until it is closed (or this
        process exits), or None if another job holds it now."""
        self.directory.mkdir(parents=True, exist_ok=True)
        lock = open(self.directory / "job.lock", "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            return None
        return lock

    # --- running ----------------------------------------------------------------------------
    def running(self) -> Endpoint | None:
        """The endpoint of a server that answers for this directory now, or None."""
        endpoint = self.endpoint()
        if endpoint is None:
            return None
        client = redis.Redis.from_url(self.url(endpoint), socket_connect_timeout=2.0, socket_timeout=2.0)
        try:
            answered = client.config_get("dir").get("dir")
        except redis.RedisError:
            return None
        finally:
            client.close()
        # Another server on a reused port would answer the ping but not hold this directory.
        return endpoint if answered == str(self.directory) else None

    def start(self, listen: Listen | None = None, *, on_parent_death: int | None = signal.SIGTERM) -> Endpoint:
        """Starts redis-server on this directory as a child of this process, which it receives
        `on_parent_death` when this process dies (Linux; None: it outlives it); returns its endpoint
        once it answers. A server that already runs here is used instead (`self.process` stays
        None). Either way this process holds the `users` lock until `stop`."""
        if shutil.which("redis-server") is None:
            raise EmbeddedRedisError(REDIS_MISSING)
        self.directory.mkdir(parents=True, exist_ok=True)
        with self._lock():
            if (endpoint := self.running()) is not None:
                if listen is not None and endpoint.listen != f"{listen.address}:{listen.port}":
                    raise EmbeddedRedisError(
                        f"the embedded Redis of {self.directory.parent} already runs (pid {endpoint.pid}) without "
                        f"--listen {listen.address}:{listen.port}: stop the genfleet command using it, then retry")
                self._wait_until_up(endpoint)  # another command's start may still be loading the AOF
                self._hold_use()
                return endpoint
            port = listen.port if listen else free_port()
            self._write_config(port, listen)
            with open(self.directory / "redis.log", "a") as log:
                self.process = subprocess.Popen(
                    ["redis-server", str(self.directory / "redis.conf")], stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=dies_with_parent(on_parent_death) if on_parent_death is not None else None)
            endpoint = Endpoint("127.0.0.1", port, self.process.pid,
                                f"{listen.address}:{listen.port}" if listen else None)
            try:
                self._wait_until_up(endpoint)
            except EmbeddedRedisError:
                self.process.kill()
                self.process.wait()
                self.process = None
                raise
            (self.directory / "endpoint.json").write_text(json.dumps(endpoint.__dict__))
            self._hold_use()
            return endpoint

    def stop(self, timeout_s: float = 60.0) -> None:
        """Ends this process's use of the server; the last user stops it (SIGTERM to a server this
        process started, SHUTDOWN to another's: either way redis writes out its AOF first)."""
        if self._use is None and self.process is None:
            return  # never used it
        with self._lock():
            if self._use is not None:
                self._use.close()  # releases this process's shared lock
                self._use = None
            process, self.process = self.process, None
            if not self._nobody_else_uses_it():
                return
            if process is not None:
                _terminate(process, timeout_s)
            elif (endpoint := self.running()) is not None:
                client = redis.Redis.from_url(self.url(endpoint), socket_timeout=timeout_s)
                try:
                    # Returns once the server has closed the connection (redis-py 8.1 commands/core.py).
                    client.shutdown()
                except redis.RedisError:
                    return  # it would not stop: it keeps running, and so does its endpoint file
            (self.directory / "endpoint.json").unlink(missing_ok=True)

    def _hold_use(self) -> None:
        if self._use is None:
            self._use = open(self.directory / "users", "a")
            fcntl.flock(self._use, fcntl.LOCK_SH)

    def _nobody_else_uses_it(self) -> bool:
        with open(self.directory / "users", "a") as users:
            try:
                fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(users, fcntl.LOCK_UN)
            return True

    def _write_config(self, port: int, listen: Listen | None) -> None:
        binds = ["127.0.0.1"]
        if listen is not None and listen.address not in binds:
            binds = [listen.address] if listen.address in ("0.0.0.0", "::") else [listen.address, "127.0.0.1"]
        lines = [
            f"port {port}",
            f"bind {' '.join(binds)}",
            f'dir "{self.directory}"',
            f'requirepass "{self.password()}"',
            "appendonly yes",
            "appendfsync everysec",
            "maxmemory-policy noeviction",
            'save ""',
            "daemonize no",
            # The log goes to stdout, which is redis.log.
            'logfile ""',
        ]
        path = self.directory / "redis.conf"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write("\n".join(lines) + "\n")

    def _wait_until_up(self, endpoint: Endpoint) -> None:
        """Until the server holds this directory and has loaded its AOF. CONFIG and INFO answer while
        it loads, every data command then fails with LOADING (redis.io "LOADING error"; redis 7
        `src/server.c` `processCommand` lets only CMD_LOADING commands through), so the AOF's
        `loading:0` in INFO persistence is what says a resumed job's data is there."""
        client = redis.Redis.from_url(self.url(endpoint), socket_connect_timeout=1.0, socket_timeout=5.0)
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while True:
                if self.process is not None and self.process.poll() is not None:
                    raise EmbeddedRedisError(f"redis-server exited ({self.process.returncode}) at start; "
                                             f"see {self.directory / 'redis.log'}")
                try:
                    # Ours, not whatever else answers on the port (a busy --listen port).
                    if (client.config_get("dir").get("dir") == str(self.directory)
                            and not int(client.info("persistence").get("loading", 0))):
                        return
                except redis.RedisError:
                    pass  # not listening yet, or not a Redis at all
                if time.monotonic() > deadline:
                    raise EmbeddedRedisError(f"redis-server did not answer within {START_TIMEOUT_S:.0f} s; "
                                             f"see {self.directory / 'redis.log'}")
                time.sleep(0.05)
        finally:
            client.close()

    @contextmanager
    def _lock(self) -> Iterator[None]:
        """One starter at a time per directory: two servers on one AOF would corrupt it."""
        with open(self.directory / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def _terminate(process: subprocess.Popen, timeout_s: float) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def redis_url_given(flag_url: str | None) -> str | None:
    """The Redis the user named (a flag, else GENFLEET_REDIS_URL), or None."""
    if flag_url:
        return flag_url
    settings = Settings()
    return settings.redis_url if "redis_url" in settings.model_fields_set else None


@contextmanager
def reach_redis(flag_url: str | None, *output_dirs: Path) -> Iterator[str]:
    """The Redis URL an operator's command uses: the one named (flag or GENFLEET_REDIS_URL); else
    the embedded Redis of the first output directory that has one (`output_dirs`, e.g. export's
    `--from`, then GENFLEET_OUTPUT_DIR, default ./output), started for as long as the command runs
    if it is not running; else the default URL."""
    if (named := redis_url_given(flag_url)) is not None:
        yield named
        return
    candidates = [EmbeddedRedis(directory) for directory in (*output_dirs, Settings().output_dir)]
    embedded = next((candidate for candidate in candidates if candidate.exists()), None)
    if embedded is None:
        yield Settings().redis_url
        return
    try:
        # Untied from this command's life: a job that starts using it meanwhile keeps it.
        endpoint = embedded.start(on_parent_death=None)
    except EmbeddedRedisError as error:
        raise EmbeddedRedisError(f"the embedded Redis of {embedded.directory.parent}: {error}") from None
    try:
        yield embedded.url(endpoint)
    finally:
        embedded.stop()
