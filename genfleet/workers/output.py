"""A worker's output: the disk guard checked before GPU time is spent, and the shard writer (group-
commit fsync) every record goes through.

Whether this worker can write its shards, checked before a task spends GPU time on a prompt.

Writable means: the output directory's file system has at least `min_free_bytes` free, and no
shard write failed in the last `recheck_s`. While it is not, tasks wait (the worker takes no new
work, as when every upstream is down), and after `wait_s` give their message back; the problem is
published in the worker's beacon so `genfleet status` names the worker and the path.

Durable, sharded JSONL output. `write` returns only once the line is fsynced, so a task that
returns (and is then acknowledged) always has its record on disk.

Many threads write at once; one flusher thread per shard commits them as a group, so 150 streams
cost one fsync per commit interval, not one each. The layout (`{out}/{run}/{dataset}/{worker}-{seq:05d}.jsonl`,
`.open` while being written) is `common/shards.py`'s.

A local fault (ENOSPC, EIO, a vanished `.open`) fails only the lines of the batch it struck, with
`ShardWriteFailed`; the flusher lives on: it cuts the broken shard back to its last durable byte,
leaves it, and the next batch starts a fresh shard. A seal (rename) that fails leaves the shard
`.open`, which every reader reads too. No `write` waits longer than its timeout.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from genfleet.common.shards import open_shard_name, sealed, shard_dir, shard_seq
from genfleet.workers.errors import DiskUnwritable, ShardWriteFailed, ShardWriterClosed, ShutdownRequested


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


log = logging.getLogger(__name__)

# A write waits at most this long for its fsync (a hung NFS mount, a stuck disk).
WRITE_TIMEOUT_S = 120.0


class ShardWriter:
    def __init__(self, directory: Path, worker: str, *, max_bytes: int, commit_interval_s: float,
                 max_age_s: float = 900.0, write_timeout_s: float = WRITE_TIMEOUT_S) -> None:
        self.directory = directory
        self.worker = worker
        self.max_bytes = max_bytes
        self.commit_interval_s = commit_interval_s
        # Sealed shards can be exported or copied while the run goes on; an idle one is sealed too.
        self.max_age_s = max_age_s
        self.write_timeout_s = write_timeout_s
        directory.mkdir(parents=True, exist_ok=True)
        self._seq = _next_seq(directory, worker)
        self._fd: int | None = None  # unbuffered: a failed write leaves nothing queued to flush later
        self._opened_at = 0.0
        self._size = 0
        self._pending: list[bytes] = []
        self._submitted = 0  # lines handed to write()
        self._settled = 0  # lines whose commit ended, fsynced or failed
        self._failed_tickets: dict[int, BaseException] = {}  # ticket -> why its batch failed
        self._closing = False
        self._cond = threading.Condition()
        self._flusher = threading.Thread(target=self._flush_loop, name=f"shard-{worker}", daemon=True)
        self._flusher.start()

    @property
    def open_path(self) -> Path:
        return self.directory / open_shard_name(self.worker, self._seq)

    def write(self, line: bytes) -> None:
        """Append one JSON line and block until it is on disk (fsynced); raises ShardWriteFailed
        if its batch could not be written or did not commit within the timeout."""
        deadline = time.monotonic() + self.write_timeout_s
        with self._cond:
            if self._closing:
                raise ShardWriterClosed(f"shard writer for {self.directory} is closed")
            self._pending.append(line)
            self._submitted += 1
            ticket = self._submitted
            self._cond.notify_all()
            while self._settled < ticket:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ShardWriteFailed(f"writing a shard in {self.directory} took over {self.write_timeout_s:g} s")
                self._cond.wait(timeout=remaining)
            error = self._failed_tickets.pop(ticket, None)
        if error is not None:
            raise ShardWriteFailed(f"writing a shard in {self.directory} failed: {error}") from error

    def close(self) -> None:
        """Flush what is pending, close the shard and drop its `.open` suffix."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._flusher.join(timeout=self.write_timeout_s)

    def _flush_loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait(timeout=min(self.max_age_s, 5.0))
                    if not self._pending and self._too_old():
                        self._rotate()
                if not self._pending and self._closing:
                    break
            # Let concurrent writers join this commit.
            time.sleep(self.commit_interval_s)
            with self._cond:
                batch, self._pending = self._pending, []
                first = self._settled + 1
            error = self._commit_or_recover(batch)
            with self._cond:
                if error is not None:
                    self._failed_tickets.update({ticket: error for ticket in range(first, first + len(batch))})
                self._settled += len(batch)
                self._cond.notify_all()
        self._seal()

    def _commit_or_recover(self, batch: list[bytes]) -> BaseException | None:
        try:
            self._commit(batch)
            return None
        except OSError as error:
            log.error("writing %d records to %s failed: %s; they go back to the queue, the next batch starts "
                      "a new shard", len(batch), self.open_path, error)
            self._abandon()
            return error

    def _commit(self, batch: list[bytes]) -> None:
        fd = self._fd
        new_file = fd is None
        if fd is None:
            fd = self._fd = os.open(self.open_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._opened_at = time.monotonic()
            self._size = os.fstat(fd).st_size
        data = memoryview(b"".join(batch))
        while data:  # os.write may write part of it (a disk filling up) before it raises
            data = data[os.write(fd, data):]
        os.fsync(fd)
        if new_file:
            _fsync_dir(self.directory)  # the new file's name must survive a crash too
        self._size += sum(map(len, batch))
        if self._size >= self.max_bytes or self._too_old():
            self._rotate()

    def _abandon(self) -> None:
        """After a failed commit: cut the shard back to its last durable byte (a torn tail would
        otherwise precede the next line), close it, and move on to a new one."""
        fd, self._fd = self._fd, None
        path = self.open_path
        self._seq += 1
        if fd is None:
            return
        try:
            os.ftruncate(fd, self._size)
            os.fsync(fd)
        except OSError as error:
            # Readers skip a torn last line of an `.open` shard; nothing acknowledged is lost.
            log.warning("could not cut %s back to %d bytes: %s", path, self._size, error)
        finally:
            os.close(fd)

    def _too_old(self) -> bool:
        return self._fd is not None and time.monotonic() - self._opened_at >= self.max_age_s

    def _rotate(self) -> None:
        self._seal()
        self._seq += 1

    def _seal(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        path = self.open_path
        try:
            os.close(fd)
            os.rename(path, sealed(path))
            _fsync_dir(self.directory)
        except OSError as error:
            # Its records are fsynced already; an unsealed shard is read like a sealed one.
            log.warning("could not seal %s: %s; it stays .open", path, error)


class ShardSet:
    """One ShardWriter per (run, dataset) for this worker process."""

    def __init__(self, root: Path, worker: str, *, max_bytes: int, commit_interval_s: float,
                 max_age_s: float = 900.0) -> None:
        self.root = root
        self.worker = worker
        self.max_bytes = max_bytes
        self.commit_interval_s = commit_interval_s
        self.max_age_s = max_age_s
        self._writers: dict[tuple[str, str], ShardWriter] = {}
        self._lock = threading.Lock()

    def write(self, run: str, dataset: str, line: bytes) -> None:
        try:
            writer = self._writer(run, dataset)
        except OSError as error:  # the shard directory could not be made (disk full, read-only)
            raise ShardWriteFailed(f"cannot prepare {shard_dir(self.root, run, dataset)}: {error}") from error
        writer.write(line)

    def close(self) -> None:
        with self._lock:
            writers, self._writers = list(self._writers.values()), {}
        for writer in writers:
            writer.close()

    def _writer(self, run: str, dataset: str) -> ShardWriter:
        with self._lock:
            writer = self._writers.get((run, dataset))
            if writer is None:
                writer = ShardWriter(shard_dir(self.root, run, dataset), self.worker, max_bytes=self.max_bytes,
                                     commit_interval_s=self.commit_interval_s, max_age_s=self.max_age_s)
                self._writers[(run, dataset)] = writer
            return writer


def _next_seq(directory: Path, worker: str) -> int:
    seqs = [seq for p in directory.iterdir() if (seq := shard_seq(p.name, worker)) is not None]
    return max(seqs, default=-1) + 1


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
