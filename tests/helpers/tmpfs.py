"""A small tmpfs, for a disk that really fills up (ENOSPC from the kernel, not a mock). Needs root
(mount); tests that use it skip where it cannot be mounted."""
from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill up (needs root): {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path: Path, leave_bytes: int = 0) -> Path:
    """Takes all free space on `path`'s file system (but `leave_bytes`) with one file; returns it.

    Something else may be writing there meanwhile (the worker under test, on a busy machine): the
    disk filling up before the free space counted at the start is taken is the aim, not an error.
    Unbuffered, so no write is left pending for `close` to fail on."""
    import errno
    import os

    filler = path / ".filler"
    stats = os.statvfs(path)
    free = stats.f_bavail * stats.f_frsize - leave_bytes
    with open(filler, "ab", buffering=0) as handle:
        chunk = b"\0" * 65536
        while free > 0:
            try:
                written = handle.write(chunk[: min(len(chunk), free)])
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
                break
            if not written:
                break
            free -= written
    return filler
