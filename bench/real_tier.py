"""SGLang's own-server tier (tests/sglang_real) put on sys.path, and what every real-server measurement
shares (`bench/real_server.py`, `bench/admission.py`): its rows file, the run's finished count, the
wait with its timeout. Its own module, so the two measurements import it and not each other."""
from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import redis

from bench.processes import REPO

TIER = REPO / "tests" / "sglang_real"
for path in (REPO / "tests", TIER):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import model_dir as tier_model  # noqa: E402,F401 - the model builder, for bench/real_server.py
from server import RealServer, sglang_venv  # noqa: E402,F401 - the server, for both measurements

RUN_TIMEOUT_S = 900.0


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def finished_prompts(client: redis.Redis, run: str) -> int:
    from genfleet.status.read_model import read_progress

    totals = read_progress(client, run).totals()
    return totals.done + totals.failed


def wait_for(done: Callable[[], bool], what: str, worker, enqueue) -> None:
    started = time.monotonic()
    while not done():
        if time.monotonic() - started > RUN_TIMEOUT_S:
            raise TimeoutError(f"{what} not finished after {RUN_TIMEOUT_S:.0f} s")
        if worker is not None and not worker.alive():
            raise RuntimeError(f"{what}: worker exited:\n{worker.tail()}")
        if enqueue is not None and enqueue.process.poll() not in (None, 0):
            raise RuntimeError(f"{what}: enqueue failed:\n{enqueue.tail()}")
        time.sleep(0.1)


def measurement_cli(doc: str, measurements: tuple[str, ...], compare: Callable[..., dict], quick: object,
                    full: object) -> None:
    """`python -m bench.<module> [--quick] [--only ...]`: the module's comparisons as JSON on stdout."""
    import argparse

    from bench.processes import interrupt_on_signals

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default=",".join(measurements))
    args = parser.parse_args()
    interrupt_on_signals()
    only = tuple(name.strip() for name in args.only.split(",") if name.strip())
    print(json.dumps(compare(quick if args.quick else full, only), indent=1, default=str))
