"""CPU time and memory of processes, read from the OS (/proc and wait4), no extra dependency."""
from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process, all its threads included."""
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / CLOCK_TICKS


def peak_rss_bytes(pid: int) -> int:
    """VmHWM: the process's resident set high-water mark."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


class MachineCpu:
    """How busy all CPUs were between `start()` and `busy_cores()`, whoever used them: the
    benchmark's own processes and anything else on the machine."""

    def __init__(self) -> None:
        self._start = _cpu_jiffies()

    def busy_cores(self) -> float:
        busy0, total0 = self._start
        busy1, total1 = _cpu_jiffies()
        return (os.cpu_count() or 1) * (busy1 - busy0) / max(total1 - total0, 1)


def _cpu_jiffies() -> tuple[int, int]:
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user
    return total - idle, total


@dataclass(frozen=True)
class Exit:
    returncode: int
    cpu_s: float  # user + system of the process and the children it waited for
    max_rss_bytes: int


def has_exited(process: subprocess.Popen) -> bool:
    """Whether a child has exited, without reaping it (Popen.poll would, losing its rusage)."""
    if process.returncode is not None:
        return True
    return os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def wait_with_usage(process: subprocess.Popen, timeout: float | None = None) -> Exit:
    """Wait for a child and take its rusage from wait4: exact even though /proc is gone after exit."""
    if timeout is not None:
        deadline = time.monotonic() + timeout
        while not has_exited(process):
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(process.args, timeout)
            time.sleep(0.05)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return Exit(returncode=process.returncode, cpu_s=usage.ru_utime + usage.ru_stime,
                max_rss_bytes=usage.ru_maxrss * 1024)
