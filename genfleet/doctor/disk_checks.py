"""The output directory the workers will write shards to: it can be created, a file in it written,
fsynced (file and directory, as `workers/output.py` does) and deleted, and its file system has
more free space than the workers' floor (`workers/output.py`, `GENFLEET_MIN_FREE_DISK_MB`), below
which they take no prompt at all.
"""
from __future__ import annotations

import os
from pathlib import Path

from genfleet.doctor.checks import Check, fail, ok
from genfleet.workers.output import DiskGuard

NAME = "output dir"
WRITABLE_FIX = "point --output-dir / GENFLEET_OUTPUT_DIR at a directory this user can write"


def output_dir_check(root: Path, *, min_free_disk_mb: int) -> Check:
    try:
        write_probe(root)
    except OSError as error:
        return fail(NAME, f"{root}: cannot write a file there: {error.strerror or error}", WRITABLE_FIX)
    floor = min_free_disk_mb * 2**20
    if problem := DiskGuard(root, min_free_bytes=floor).problem():
        return fail(NAME, problem, "free space there, or point --output-dir / GENFLEET_OUTPUT_DIR at a larger disk")
    stats = os.statvfs(root)
    free = stats.f_bavail * stats.f_frsize
    return ok(NAME, f"{root}: writable, fsync ok, {free / 2**30:,.1f} GiB free (floor {min_free_disk_mb:,} MiB)")


def write_probe(root: Path) -> None:
    """Creates `root` (as a worker would), then writes, fsyncs and deletes a file in it."""
    root.mkdir(parents=True, exist_ok=True)
    probe = root / f".genfleet-doctor-{os.getpid()}"
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, b"genfleet doctor\n")
        os.fsync(fd)
    finally:
        os.close(fd)
        probe.unlink()
    directory = os.open(root, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
