"""Whether this worker can write its shards, checked before a task spends GPU time on a prompt.

Writable means: the output directory's file system has at least `min_free_bytes` free, and no
shard write failed in the last `recheck_s`. While it is not, tasks wait (the worker takes no new
work, as when every upstream is down), and after `wait_s` give their message back; the problem is
published in the worker's beacon so `genfleet status` names the worker and the path.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from genfleet.workers.errors import ShutdownRequested


class DiskUnwritable(Exception):
    """A local fault: the prompt goes back to the queue untouched, never to the dead letters."""


class DiskGuard:
    def __init__(self, root: Path, *, min_free_bytes: int, recheck_s: float = 5.0) -> None:
        self.root = root
        self.min_free_bytes = min_free_bytes
        self.recheck_s = recheck_s
        self._lock = threading.Lock()
        self._failure: tuple[float, str] | None = None  # (monotonic time, what failed)
        self._checked_at = -1e9
        self._space_problem: str | None = None

    def failed(self, what: str) -> None:
        """A shard write failed: the disk counts as unwritable for `recheck_s`; after that only the
        free-space floor decides (the next write tells whether the fault is gone)."""
        with self._lock:
            self._failure = (time.monotonic(), what)

    def problem(self) -> str | None:
        """Why the shards cannot be written now, or None."""
        now = time.monotonic()
        with self._lock:
            if self._failure and now - self._failure[0] < self.recheck_s:
                return self._failure[1]
            if now - self._checked_at >= 1.0:  # statvfs at most once a second, however many threads ask
                self._checked_at, self._space_problem = now, self._free_space_problem()
            return self._space_problem

    def wait_writable(self, wait_s: float, should_stop: Callable[[], bool]) -> None:
        """Returns once the shards can be written; raises DiskUnwritable after `wait_s`."""
        deadline = time.monotonic() + wait_s
        while (problem := self.problem()) is not None:
            if should_stop():
                raise ShutdownRequested()
            if time.monotonic() >= deadline:
                raise DiskUnwritable(f"cannot write shards: {problem}")
            time.sleep(1.0)

    def _free_space_problem(self) -> str | None:
        path = self.root
        while not path.exists() and path != path.parent:
            path = path.parent  # the output dir may not exist yet: its nearest parent's file system
        try:
            stats = os.statvfs(path)
        except OSError as error:
            return f"{self.root}: {error}"
        free = stats.f_bavail * stats.f_frsize
        if free < self.min_free_bytes:
            return (f"{self.root}: {free / 2**20:,.0f} MiB free, below the floor of "
                    f"{self.min_free_bytes / 2**20:,.0f} MiB (GENFLEET_MIN_FREE_DISK_MB)")
        return None
