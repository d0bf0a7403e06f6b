"""What one `make bench` collected: the machine it ran on, and every run of every measurement.
`bench/report.py` renders it; `--json` writes `Results.raw()`."""
from __future__ import annotations

import os
import platform
import subprocess
import time
from dataclasses import asdict, dataclass, field

from bench.processes import REPO
from bench.scaling import HostProfile, Scaling
from bench.throughput import Comparison, Profile


@dataclass
class Machine:
    cpu: str
    cores: int
    memory_gb: float
    kernel: str
    python: str
    redis: str
    commit: str
    date: str
    load_start: tuple[float, float, float]
    load_end: tuple[float, float, float] | None = None

    def finish(self) -> None:
        self.load_end = os.getloadavg()


def machine_info() -> Machine:
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = 0.0
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                memory = int(line.split()[1]) / 2**20
    except OSError:
        pass
    return Machine(cpu=cpu, cores=os.cpu_count() or 0, memory_gb=memory, kernel=platform.release(),
                   python=platform.python_version(), redis=_command("redis-server", "--version"),
                   commit=_commit(), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   load_start=os.getloadavg())


def _command(*args: str) -> str:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=10, cwd=REPO).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def _commit() -> str:
    sha = _command("git", "rev-parse", "--short", "HEAD") or "unknown"
    dirty = _command("git", "status", "--porcelain", "--untracked-files=no")
    return f"{sha} (with uncommitted changes)" if dirty else sha


@dataclass
class Results:
    quick: bool
    repeats: int
    only: list[str]
    machine: Machine
    throughput_profile: Profile | None = None
    scaling_profile: HostProfile | None = None
    throughput: list[Comparison] = field(default_factory=list)
    scaling: list[Scaling] = field(default_factory=list)
    onebox: list[dict] = field(default_factory=list)  # bench/onebox.py, one per run
    enqueue: list[dict] = field(default_factory=list)
    enqueue_error: str | None = None
    export: dict | None = None
    export_error: str | None = None
    useful: list[dict] = field(default_factory=list)  # bench/useful_tokens.py, one per run
    loop_guard: dict | None = None  # bench/loop_guard.py: CPU per token and overruns, once
    affinity: dict | None = None  # bench/affinity.py: prefix-affinity vs least-busy routing, once
    shared_tail: dict | None = None  # bench/shared_tail.py: two runs apart and sharing one host, once
    control: dict | None = None  # bench/control_plane.py: raw figures and their model, once
    control_error: str | None = None
    real_server: dict | None = None  # bench/real_server.py: on SGLang's own server, beside the sim, once
    real_server_error: str | None = None
    vllm_server: dict | None = None  # bench/vllm_server.py: on vLLM's own server, once
    vllm_server_error: str | None = None
    # bench/sweep.py: the operating point on each server's own engine ("sglang", "vllm"), once
    sweeps: dict[str, dict] = field(default_factory=dict)
    sweep_errors: dict[str, str] = field(default_factory=dict)
    elapsed_s: float = 0.0

    def raw(self) -> dict:
        return {"machine": asdict(self.machine), "quick": self.quick, "repeats": self.repeats,
                "throughput": [c.to_dict() for c in self.throughput],
                "scaling": [s.to_dict() for s in self.scaling], "onebox": self.onebox, "enqueue": self.enqueue,
                "export": self.export,
                "useful": self.useful, "loop_guard": self.loop_guard, "affinity": self.affinity,
                "control": self.control, "shared_tail": self.shared_tail,
                "real_server": self.real_server, "vllm_server": self.vllm_server, "sweeps": self.sweeps}
