"""The child processes of a one-box command (`genfleet run`, `genfleet demo`): each in its own
session, its output in a log file, stopped in order (Redis last) and, on Linux, killed with their
parent however it dies.

Each child gets a session of its own so that a Ctrl-C on the terminal reaches the parent alone: it
then stops the workers first (they still ack, release leases and seal shards through Redis) and
Redis last. Were they in the terminal's process group, redis-server would exit on the same SIGINT
under the workers' feet.

A parent killed with SIGKILL runs no code, so the kernel stops its children instead: `prctl(
PR_SET_PDEATHSIG)` (Linux's prctl(2)) asks it to send each child a signal when the thread that
started it dies. Workers and the producer get SIGKILL, the same as `kill -9` of the whole tree (the
shards are the truth, and a re-run resumes); redis-server gets SIGTERM, on which it shuts down
as on `SHUTDOWN`, calling fsync on the AOF first (redis-doc `topics/signals.md`, "Handling of
SIGTERM and SIGINT"; redis `src/server.c` `prepareForShutdown`). Elsewhere (macOS) children
outlive a SIGKILLed parent, as with any shell job.
"""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from genfleet import ToolError

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class ChildFailed(ToolError):
    """A child process did not come up or died; the message says which and where its log is."""


def genfleet(*args: str) -> list[str]:
    """A genfleet command run by this same interpreter: the installed package's, wherever it is."""
    return [sys.executable, "-m", "genfleet", *args]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def dies_with_parent(signum: int) -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child get `signum` when this process dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()

    def arrange() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the call: nobody would send it
            os.kill(os.getpid(), signum)

    return arrange


class Processes:
    """Child processes in their own sessions, all stopped on exit (Ctrl-C included); Redis, named
    `redis`, last."""

    def __init__(self, logs: Path, env: dict[str, str]) -> None:
        self.logs, self.env = logs, env
        self.children: list[tuple[str, subprocess.Popen]] = []
        self.offsets: dict[str, int] = {}  # where each child's output starts in its log

    def output(self, name: str) -> str:
        """What the child started as `name` has written (not what earlier ones left in the log)."""
        with open(self.log(name), errors="replace") as log:
            log.seek(self.offsets.get(name, 0))
            return log.read()

    def start(self, name: str, *args: str, on_parent_death: int = signal.SIGKILL) -> subprocess.Popen:
        """Starts `args` with its output appended to `logs/{name}.log` (a resumed job keeps the log
        of the one before). Call it from the main thread: the death signal is tied to the thread
        that starts the child."""
        log = open(self.logs / f"{name}.log", "a")
        log.write(f"--- started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        log.flush()
        self.offsets[name] = log.tell()
        try:
            process = subprocess.Popen(args, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True, preexec_fn=dies_with_parent(on_parent_death))
        finally:
            log.close()  # the child has its own copy
        self.children.append((name, process))
        return process

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def check_alive(self, *, ignoring: tuple[str, ...] = ()) -> None:
        for name, process in self.children:
            if name not in ignoring and process.poll() is not None:
                raise ChildFailed(f"{name} exited ({process.returncode}); see {self.log(name)}")

    def stop_all(self, grace_s: float = 15.0) -> None:
        """Everything else first, together; Redis last: a worker shutting down still acks, releases
        its leases and closes its shards (renames the `.open` files) through it."""
        stop([process for name, process in self.children if name != "redis"], grace_s)
        stop([process for name, process in self.children if name == "redis"], grace_s)

    def kill_all(self) -> None:
        """At once (a second Ctrl-C): SIGKILL for all but Redis, which still writes out its AOF."""
        for name, process in self.children:
            if process.poll() is None:
                _signal_group(process, signal.SIGTERM if name == "redis" else signal.SIGKILL)
        for _, process in self.children:
            process.wait()


def stop(processes: list[subprocess.Popen], grace_s: float = 15.0) -> None:
    """SIGTERM to each one's process group, SIGKILL to whatever still runs after `grace_s`."""
    for process in processes:
        if process.poll() is None:
            _signal_group(process, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in processes:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.wait()


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:  # gone meanwhile
        pass


def wait_for(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Polls `check` until it is true; a `ChildFailed` it raises ends the wait at once."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except ChildFailed:
            raise
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.2)
    raise ChildFailed(f"{what} did not come up within {timeout:.0f} s")
