"""Stopping a child process a test started: SIGTERM, then SIGKILL if it lingers."""
from __future__ import annotations

import subprocess


def terminate(process: subprocess.Popen | None, timeout: float = 10.0) -> None:
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
